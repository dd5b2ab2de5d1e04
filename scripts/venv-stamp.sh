# Whether .venv is current: sourced by scripts/setup.sh and scripts/run-exporter.sh, from the
# repository root. After an install that succeeded, scripts/setup.sh leaves a stamp in .venv:
# the SHA-256 of what the install is made from (pyproject.toml and scripts/setup.sh) and what
# it installed (`base`: the package; `test`: with the [test] extras, which include the base).
# A `git pull` that changes either file makes the venv stale, so it is installed again.

venv_stamp_file=.venv/mlx-medic-setup.stamp

# The SHA-256 of pyproject.toml and scripts/setup.sh (sha256sum on Linux, shasum on macOS).
venv_digest() {
  if command -v sha256sum >/dev/null; then
    cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1
  else
    cat pyproject.toml scripts/setup.sh | shasum -a 256 | cut -d' ' -f1
  fi
}

# Record that .venv now holds install $1 (base or test) of today's files.
venv_write_stamp() {
  local digest
  if ! digest=$(venv_digest) || [ -z "$digest" ]; then
    echo "setup: neither sha256sum nor shasum works; no stamp, so scripts/run-exporter.sh" \
      "will set up on every start" >&2
    return 0
  fi
  echo "$digest $1" >"$venv_stamp_file"
}

# Succeed when .venv has mlx-medic and a stamp of today's files whose install covers $1:
# base is covered by a base or a test install, test only by a test install.
venv_current() {
  local digest installed
  [ -x .venv/bin/mlx-medic ] && [ -f "$venv_stamp_file" ] || return 1
  read -r digest installed <"$venv_stamp_file" || return 1
  [ "$digest" = "$(venv_digest)" ] || return 1
  case "$1:$installed" in
    base:base | base:test | test:test) return 0 ;;
    *) return 1 ;;
  esac
}
