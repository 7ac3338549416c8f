#!/usr/bin/env bash
# Installs a Resident scheduler or agent as a hardened systemd service:
#   sudo deploy/systemd/install.sh scheduler|agent [--binary PATH] [--token TOKEN]
# Creates the system user `resident`, /etc/resident (root:resident 0750) with the role's env
# file (kept if it exists), the binary at /usr/local/bin/resident and the unit; then
# reloads systemd. It neither enables nor starts the service: fill the env file first.
# --root DIR installs under DIR and skips useradd, chown and systemctl (for tests and
# image builds).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
role=${1:-}
shift || true
binary="$here/../../target/release/resident"
root=""
token=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --binary) binary=$2; shift 2 ;;
    --root) root=$2; shift 2 ;;
    --token) token=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
case $role in
  scheduler | agent) ;;
  *) echo "usage: $0 scheduler|agent [--binary PATH] [--token TOKEN] [--root DIR]" >&2; exit 2 ;;
esac
if [[ ! -x $binary ]]; then
  echo "no resident binary at $binary: build it (cargo build --release -p resident-cli) or pass --binary" >&2
  exit 1
fi
if [[ -z $root && $EUID -ne 0 ]]; then
  echo "run as root (it creates a user and installs a unit), or pass --root DIR" >&2
  exit 1
fi
if [[ -z $root ]] && ! id resident >/dev/null 2>&1; then
  useradd --system --user-group --home-dir /var/lib/resident --shell /usr/sbin/nologin resident
fi
install -d -m 0755 "$root/usr/local/bin" "$root/etc/systemd/system"
install -d -m 0750 "$root/etc/resident"
install -m 0755 "$binary" "$root/usr/local/bin/resident"
install -m 0644 "$here/resident-$role.service" "$root/etc/systemd/system/resident-$role.service"
env_file="$root/etc/resident/$role.env"
if [[ -e $env_file ]]; then
  echo "keeping $env_file"
else
  sed -e "s/@HOSTNAME@/$(hostname)/" -e "s/@AGENT_TOKEN@/${token}/" "$here/$role.env" > "$env_file"
  chmod 0640 "$env_file"
  echo "wrote $env_file: edit it before starting"
fi
if [[ -z $root ]]; then
  chown -R root:resident /etc/resident
  systemctl daemon-reload
  echo "next: edit /etc/resident/$role.env, then: systemctl enable --now resident-$role"
fi
