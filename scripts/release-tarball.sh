#!/usr/bin/env bash
# Makes the release tarball of kolos that the Spack recipe fetches, and
# prints its sha256 (docs/launching.md, "Spack", "Releases").
#
#   scripts/release-tarball.sh VERSION [REF] [OUTDIR]
#
# VERSION  the release, e.g. 0.1.0 (the project's CMake version at REF)
# REF      the tag or commit to pack (default v$VERSION)
# OUTDIR   where kolos-VERSION.tar.gz goes (default spack/releases, where
#          the recipe's url looks; a site copies it into its Spack mirror as
#          kolos/kolos-VERSION.tar.gz)
#
# The tarball is deterministic: `git archive` of the commit's tree (file
# order, modes and the commit's time as every mtime all come from git), with
# the prefix kolos-VERSION/, compressed with `gzip -n` (no name, no time in
# the gzip header). The same commit gives the same bytes, so a sha256 written
# into the recipe can be checked by anyone from a checkout.
#
# The recipe inside the tarball cannot carry the tarball's own sha256: the
# sha256 goes into spack/packages/kolos/package.py in a commit after the tag.
# Spack reads the recipe from the repository it was given (`spack repo add`),
# never the copy inside the tarball.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 3 ]]; then
  echo "usage: $0 VERSION [REF] [OUTDIR]" >&2
  exit 2
fi
version=$1
ref=${2:-v$version}
top=$(git -C "$(dirname "${BASH_SOURCE[0]}")/.." rev-parse --show-toplevel)
outdir=${3:-$top/spack/releases}

commit=$(git -C "$top" rev-parse --verify --quiet "$ref^{commit}") || {
  echo "$0: $ref is not a tag or commit of $top (make the release tag first: git tag -a v$version)" >&2
  exit 1
}
# The tarball must be the version it is named for.
cmake_version=$(git -C "$top" show "$commit:CMakeLists.txt" |
  sed -n 's/^project(kolos VERSION \([0-9.]*\).*/\1/p')
if [[ $cmake_version != "$version" ]]; then
  echo "$0: $ref ($commit) is kolos $cmake_version (CMakeLists.txt), not $version" >&2
  exit 1
fi

mkdir -p "$outdir"
out=$outdir/kolos-$version.tar.gz
tmp=$(mktemp "$outdir/.kolos-$version.XXXXXX")
trap 'rm -f "$tmp"' EXIT
git -C "$top" archive --format=tar --prefix="kolos-$version/" "$commit" | gzip -n -9 >"$tmp"
mv "$tmp" "$out"
trap - EXIT
sha=$(sha256sum "$out" | cut -d' ' -f1)
echo "$out"
echo "commit  $commit"
echo "sha256  $sha"
echo "recipe: version(\"$version\", sha256=\"$sha\")"
