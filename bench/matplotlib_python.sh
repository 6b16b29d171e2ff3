# Sourced by the experiment scripts: sets $python to the first python3 with
# matplotlib, installing Debian's python3-matplotlib when running as root. The
# Debian package installs it for /usr/bin/python3, which a python3 earlier on
# PATH (pyenv, a venv) does not see.
python=""
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c "import matplotlib" 2>/dev/null; then python="$candidate"; break; fi
done
if [[ -z "$python" ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "python3-matplotlib is missing: sudo apt-get install -y python3-matplotlib" >&2
    exit 1
  fi
  apt-get install -y python3-matplotlib >/dev/null || { echo "installing python3-matplotlib failed" >&2; exit 1; }
  python=/usr/bin/python3
fi
