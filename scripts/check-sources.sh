#!/usr/bin/env bash
# Fails, naming the file, when a crate file could hide from git: a source, build script,
# kernel, proto or manifest that is ignored or untracked. Part of the test command, so CI runs
# it on every landing. Three checks:
#  1. the ignore rules: for every crate (each tracked Cargo.toml), the files a crate can have
#     (Cargo.toml, build.rs, src/**, tests/, benches/, examples/, *.cu, *.cuh, *.proto) must
#     not match a rule in .gitignore; this holds on a clean clone too, where nothing is
#     untracked, and is what would have caught models/build.rs;
#  2. the tree: no Cargo.toml, build.rs, src/** file, kernel or proto under a crate is
#     untracked or ignored (a developer's checkout, before committing), and none tracked
#     matches an ignore rule;
#  3. packaging: a crate whose Cargo.toml has an `include` list ships its build.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "check-sources: not a git checkout; nothing to check" >&2
  exit 0
fi
failures=()

# The crates: folders of tracked Cargo.toml files ('.' is the workspace root).
mapfile -t crates < <(git ls-files -- 'Cargo.toml' '*/Cargo.toml' | xargs -n1 dirname | sort -u)

# 1. Paths a crate may hold, probed against the ignore rules without touching the tree.
probe_paths() { # crate dir
  local c=$1 p
  [[ $c == . ]] && p="" || p="$c/"
  printf '%s\n' "${p}Cargo.toml" "${p}build.rs" "${p}src/lib.rs" "${p}src/main.rs" \
    "${p}src/module/mod.rs" "${p}src/kernels.cu" "${p}src/kernels.cuh" "${p}src/module/kernels.cu" \
    "${p}kernels/kernels.cu" "${p}kernels.cu" "${p}proto/package/v1/service.proto" "${p}service.proto" \
    "${p}tests/test.rs" "${p}benches/bench.rs" "${p}examples/example.rs"
}
for crate in "${crates[@]}"; do
  while IFS= read -r line; do
    [[ -n $line ]] && failures+=("a crate file would be ignored: $line")
  done < <(probe_paths "$crate" | git check-ignore --no-index --verbose --stdin 2>/dev/null |
    awk -F'\t' '{ n = split($1, source, ":"); if (source[n] !~ /^!/) print $2 " (rule " $1 ")" }' || true)
done

# 2. Real files under a crate that git does not hold, or holds against an ignore rule.
is_crate_file() { # path relative to the root
  local path=$1 crate rest
  for crate in "${crates[@]}"; do
    [[ $crate == . ]] && continue
    [[ $path == "$crate"/* ]] || continue
    rest=${path#"$crate"/}
    case $rest in
      Cargo.toml | build.rs | src/* | *.cu | *.cuh | *.proto) return 0 ;;
    esac
  done
  case $path in
    */*) return 1 ;;
    Cargo.toml | build.rs | *.proto) return 0 ;;
  esac
  return 1
}
while IFS= read -r path; do
  is_crate_file "$path" && failures+=("a crate file is not tracked: $path (git add it)")
done < <(git ls-files --others --exclude-standard -- . ':(exclude)target')
while IFS= read -r path; do
  is_crate_file "$path" && failures+=("a crate file is ignored: $path (fix .gitignore, then git add it)")
done < <(git ls-files --others --ignored --exclude-standard -- . ':(exclude)target')
while IFS= read -r path; do
  is_crate_file "$path" && failures+=("a tracked crate file matches an ignore rule: $path (fix .gitignore)")
done < <(git ls-files --cached --ignored --exclude-standard)

# 3. Packaging: an `include` list must name build.rs where the crate has one.
for crate in "${crates[@]}"; do
  manifest=$crate/Cargo.toml
  if [[ -f $crate/build.rs ]] && grep -q '^include *=' "$manifest" &&
    ! grep '^include *=' "$manifest" | grep -q '"build.rs"'; then
    failures+=("$manifest has an include list without \"build.rs\": a package would leave out its build script")
  fi
done

if ((${#failures[@]})); then
  printf 'check-sources: %s\n' "${failures[@]}" >&2
  exit 1
fi
echo "check-sources: every crate file is tracked and none can be ignored (${#crates[@]} crates)"
