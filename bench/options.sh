# Command-line options of the bench/run_*.sh scripts (sourced).
#
#   bench_options SCRIPT SPEC "$@"
#
# sets the script's variables from its arguments. SPEC lists the options,
# space-separated:
#   name        --name VALUE sets $name ('_' in the name is '-' in the flag:
#               seq_len is --seq-len)
#   var:flag    --flag VALUE sets $var
#   var:flag=V  --flag, without a value, sets $var to V
#   var:flag+   --flag VALUE appends "--flag VALUE" to the array $var
# -h or --help prints SCRIPT's opening comment (after the #! line) and exits
# 0; an argument SPEC does not list, or an option without its value, exits
# 2 naming it.
bench_options() {
  local _bo_script=$1 _bo_spec=$2 _bo_item _bo_var _bo_flag
  shift 2
  local -A _bo_kind=() _bo_target=() _bo_value=()
  for _bo_item in $_bo_spec; do
    if [[ $_bo_item == *:* ]]; then
      _bo_var=${_bo_item%%:*} _bo_flag=${_bo_item#*:}
    else
      _bo_var=$_bo_item _bo_flag=${_bo_item//_/-}
    fi
    case "$_bo_flag" in
      *=*) _bo_kind[--${_bo_flag%%=*}]=switch _bo_value[--${_bo_flag%%=*}]=${_bo_flag#*=}
           _bo_flag=${_bo_flag%%=*} ;;
      *+) _bo_flag=${_bo_flag%+} _bo_kind[--$_bo_flag]=append ;;
      *) _bo_kind[--$_bo_flag]=value ;;
    esac
    _bo_target[--$_bo_flag]=$_bo_var
  done
  local _bo_name
  _bo_name=$(basename "$_bo_script")
  while [[ $# -gt 0 ]]; do
    if [[ $1 == -h || $1 == --help ]]; then
      sed -n '2,/^[^#]/p' "$_bo_script" | sed '/^[^#]/d; s/^# \{0,1\}//; s/^#$//'
      exit 0
    fi
    case "${_bo_kind[$1]:-}" in
      switch) printf -v "${_bo_target[$1]}" '%s' "${_bo_value[$1]}"; shift; continue ;;
      value | append) ;;
      *) echo "$_bo_name: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    [[ $# -ge 2 ]] || { echo "$_bo_name: $1 needs a value (see --help)" >&2; exit 2; }
    if [[ ${_bo_kind[$1]} == value ]]; then
      printf -v "${_bo_target[$1]}" '%s' "$2"
    else
      eval "${_bo_target[$1]}+=(\"\$1\" \"\$2\")"
    fi
    shift 2
  done
}
