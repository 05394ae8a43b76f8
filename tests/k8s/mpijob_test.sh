#!/usr/bin/env bash
# Renders every kustomization under k8s/ with `kubectl kustomize` and
# validates each MPIJob against the MPIJob CRD and the operator's rules
# (validate_mpijobs.py); then checks that every deliberately broken manifest
# in broken/ is refused with the message its `# expect:` line names.
#
# Environment: KOLOS_SOURCE_DIR (the repository), KOLOS_MPIJOB_CRD_DIR (a
# directory with kubeflow.org_mpijobs.yaml; CI points it at ../shared/k8s).
# Exit 77 (CTest: "Skipped", listed under "tests did not run") when the CRD
# or kubectl is missing: the test says so and never passes silently.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${KOLOS_SOURCE_DIR:-$(cd "$here/../.." && pwd)}
crd=${KOLOS_MPIJOB_CRD_DIR:-}/kubeflow.org_mpijobs.yaml
py=/usr/bin/python3  # Debian's, with python3-jsonschema and python3-yaml
[[ -x $py ]] || py=python3

not_run() { echo "NOT RUN: $* -- the MPIJob manifests were NOT validated" >&2; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }

[[ -n ${KOLOS_MPIJOB_CRD_DIR:-} ]] ||
  not_run "KOLOS_MPIJOB_CRD_DIR is not set (point it at a directory with kubeflow.org_mpijobs.yaml, e.g. ../shared/k8s)"
[[ -f $crd ]] || not_run "$crd does not exist"
command -v kubectl >/dev/null || not_run "kubectl is not installed (kustomize >= v4 needed: kubectl >= 1.21)"
"$py" -c "import jsonschema, yaml" 2>/dev/null || fail "python3-jsonschema and python3-yaml are needed (scripts/install-deps.sh)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

dirs=()
while IFS= read -r k; do dirs+=("$(dirname "$k")"); done < <(find "$src/k8s" -name kustomization.yaml | sort)
[[ ${#dirs[@]} -ge 3 ]] || fail "expected k8s/base and at least two overlays, found ${#dirs[@]} kustomizations"

status=0
for dir in "${dirs[@]}"; do
  name=${dir#"$src/"}
  out=$work/$(tr / _ <<<"$name").yaml
  if ! kubectl kustomize "$dir" >"$out" 2>"$work/err"; then
    cat "$work/err" >&2
    echo "FAIL: kubectl kustomize $name" >&2
    status=1
    continue
  fi
  # Kustomize's warnings (deprecated fields) count as failures: they break later.
  if [[ -s $work/err ]]; then cat "$work/err" >&2; echo "FAIL: kubectl kustomize $name warned" >&2; status=1; fi
  "$py" "$here/validate_mpijobs.py" --crd "$crd" "$out" | sed "s|^$out|$name|" || status=1
done

for broken in "$here"/broken/*.yaml; do
  name=broken/$(basename "$broken")
  expect=$(sed -n 's/^# expect: //p' "$broken")
  [[ -n $expect ]] || { echo "FAIL: $name has no '# expect:' line" >&2; status=1; continue; }
  out=$("$py" "$here/validate_mpijobs.py" --crd "$crd" "$broken")
  rc=$?
  if [[ $rc -eq 0 ]]; then
    echo "FAIL: $name was accepted" >&2; status=1
  elif ! grep -Eq -- "$expect" <<<"$out"; then
    echo "$out" >&2; echo "FAIL: $name refused, but not with /$expect/" >&2; status=1
  else
    echo "$name: refused as expected: $(grep -E -- "$expect" <<<"$out" | head -n 1 | sed 's/^[^ ]* //')"
  fi
done
[[ $status -eq 0 ]] && echo "PASS: ${#dirs[@]} kustomizations valid, $(find "$here/broken" -name "*.yaml" | wc -l) broken manifests refused"
exit $status
