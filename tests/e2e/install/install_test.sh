#!/usr/bin/env bash
# Where `kolos plugins` looks, for an installed tree and for the build tree:
#   install_test.sh CASE   (environment: KOLOS, KOLOS_BINARY_DIR, KOLOS_PLUGIN_BUILD_DIR)
# installed_tree      `cmake --install` into a temporary prefix: the installed
#                     kolos lists its own lib/kolos/plugins, nothing from the
#                     build tree, and no plugin refused as shadowed.
# build_tree          build/bin/kolos, also through a symlink from elsewhere,
#                     still finds the build tree's plugins.
# moved_build_binary  a copy of build/bin/kolos outside the build tree does
#                     not search the build tree's plugin directory.
# KOLOS_PLUGIN_PATH (set for every test by the suite) is unset for each run.
set -uo pipefail
case_name=$1
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

# The running binary's path is resolved (/proc/self/exe): compare resolved paths.
work=$(realpath "$work")
build_plugins=$(realpath "$KOLOS_PLUGIN_BUILD_DIR")
build_dir=$(realpath "$KOLOS_BINARY_DIR")
[[ -e "$build_plugins/libkolos_dp.so" ]] || fail "no dp plugin in the build tree ($build_plugins)"

# plugins_of BINARY: `BINARY plugins` with no KOLOS_PLUGIN_PATH, into out.txt.
plugins_of() {
  env -u KOLOS_PLUGIN_PATH timeout 60 "$@" plugins >out.txt 2>err.txt ||
    { cat out.txt err.txt; fail "$* plugins failed"; }
  cat out.txt
}

case "$case_name" in
  installed_tree)
    prefix="$work/prefix"
    cmake --install "$KOLOS_BINARY_DIR" --prefix "$prefix" >install.log 2>&1 ||
      { cat install.log; fail "cmake --install failed"; }
    plugins_of "$prefix/bin/kolos"
    grep -q "^searched: $prefix/lib/kolos/plugins\$" out.txt ||
      fail "the installed kolos should search exactly its own lib/kolos/plugins"
    grep -q " $prefix/lib/kolos/plugins/libkolos_dp.so\$" out.txt ||
      fail "the installed kolos does not list its own dp plugin"
    ! grep -F -e "$build_dir" -e "$KOLOS_BINARY_DIR" out.txt ||
      fail "the installed kolos searches or lists the build tree"
    ! grep -q "shadowed" out.txt || fail "the installed kolos refuses plugins as shadowed"
    # Configured paths still come first.
    mkdir extra
    env -u KOLOS_PLUGIN_PATH "$prefix/bin/kolos" plugins --path "$work/extra" >out.txt ||
      fail "kolos plugins --path failed"
    grep -q "^searched: $work/extra $prefix/lib/kolos/plugins\$" out.txt ||
      { cat out.txt; fail "--path is not searched first"; }
    KOLOS_PLUGIN_PATH="$build_plugins" "$prefix/bin/kolos" plugins >out.txt ||
      fail "kolos plugins with KOLOS_PLUGIN_PATH failed"
    grep -q "^searched: $build_plugins $prefix/lib/kolos/plugins\$" out.txt ||
      { cat out.txt; fail "KOLOS_PLUGIN_PATH is not searched"; }
    ;;
  build_tree)
    plugins_of "$KOLOS"
    grep -q " $build_plugins/libkolos_dp.so\$" out.txt ||
      grep -q " $KOLOS_PLUGIN_BUILD_DIR/libkolos_dp.so\$" out.txt ||
      fail "build/bin/kolos does not find the build tree's dp plugin"
    ! grep -q "shadowed" out.txt || fail "build/bin/kolos refuses plugins as shadowed"
    mkdir -p elsewhere/bin
    ln -s "$(realpath "$KOLOS")" elsewhere/bin/kolos
    plugins_of "$work/elsewhere/bin/kolos"
    grep -q "libkolos_dp.so\$" out.txt ||
      fail "a symlink to build/bin/kolos does not find the build tree's plugins"
    ;;
  moved_build_binary)
    mkdir -p copy/bin
    cp "$(realpath "$KOLOS")" copy/bin/kolos
    LD_LIBRARY_PATH="$build_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" plugins_of "$work/copy/bin/kolos"
    ! grep -F -e "$build_plugins" -e "$KOLOS_PLUGIN_BUILD_DIR" out.txt ||
      fail "a kolos binary outside the build tree searches the build tree's plugins"
    grep -q "^no plugins found" out.txt || fail "expected no plugins for a binary outside any tree"
    ;;
  *)
    fail "unknown case $case_name"
    ;;
esac
echo "PASS $case_name"
