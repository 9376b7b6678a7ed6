# Sourced by the setup scripts: the one way they make a virtual environment and install
# into it. uv (Astral's installer, pinned, in .uv/) where it can be installed, else pip:
# uv fetches in parallel and installs from one cache for every environment.
# uv does not read pip's configuration, so the settings a machine gives pip (find-links,
# a constraints file, an extra index that exists) are handed to it.
UV_VERSION=0.13.9
uv_bin=.uv/bin/uv
python=${PYTHON:-python3}

if [ ! -x "$uv_bin" ] && [ "${PADDLE_RESNET_PIP:-0}" != 1 ]; then
  (
    flock 8
    [ -x "$uv_bin" ] || { "$python" -m venv .uv && .uv/bin/python -m pip install -q "uv==$UV_VERSION"; }
  ) 8> .uv.lock > /dev/null 2>&1 || echo "installer: uv could not be installed: pip installs instead"
fi

uv_settings=()
for setting in find-links constraint extra-index-url; do
  for value in $("$python" -m pip config get "global.$setting" 2>/dev/null) \
    $(printenv "PIP_$(echo "$setting" | tr a-z- A-Z_)" || true); do
    path=${value#file://}
    case "$setting" in
      find-links) [ -e "$path" ] && uv_settings+=(--find-links "$path") ;;
      constraint) [ -f "$path" ] && uv_settings+=(--constraint "$path") ;;
      extra-index-url) { [ "$path" != "$value" ] && [ ! -e "$path" ]; } || uv_settings+=(--extra-index-url "$value") ;;
    esac
  done
done

uses_uv() { [ -x "$uv_bin" ] && [ "${PADDLE_RESNET_PIP:-0}" != 1 ]; }

# make_venv DIR: a virtual environment in DIR (with pip in it, as python -m venv makes one)
make_venv() {
  [ -x "$1/bin/python" ] && return 0
  if uses_uv; then
    "$uv_bin" venv -q --seed --python "$python" "$1"
    # uv seeds pip and setuptools without bytecode, and Paddle imports setuptools in every
    # process (paddle.utils.cpp_extension): where Python writes no bytecode itself, each
    # process compiled it again (import paddle 1.39 -> 1.24 CPU-s: docs/measurements.md)
    if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
      "$1/bin/python" -m compileall -q "$1/lib" > /dev/null
    fi
  else
    "$python" -m venv "$1"
  fi
}

# install_into DIR ARGS...: pip install ARGS into the environment DIR
install_into() {
  local venv=$1
  shift
  if uses_uv; then
    # every index alike, as pip takes them. Bytecode: Python writes it for each module
    # the first time one is imported; where it may not (PYTHONDONTWRITEBYTECODE set), it is
    # compiled here for every file, or each process would compile Paddle's sources again
    # (compiling all 18,000 files of an environment costs 105 CPU-s, importing them lazily
    # a few: the test suite unsets the variable).
    local compile=()
    [ -n "${PYTHONDONTWRITEBYTECODE:-}" ] && compile=(--compile-bytecode)
    "$uv_bin" pip install -q --python "$venv/bin/python" --index-strategy unsafe-best-match \
      "${compile[@]}" "${uv_settings[@]}" "$@"
  else
    "$venv/bin/python" -m pip install -q "$@"
  fi
}
