#!/usr/bin/env bash
# Sourced by the benchmarks that compare builds (versions.sh, kube_launch.sh): `build_rev REV
# DEST` builds the release `trainyard` of a commit from a scratch worktree (kept between runs,
# sharing this checkout's target folder so dependencies compile once; uncommitted changes are not
# measured) and copies it to DEST.
build_rev() {
  local rev=$1 dest=$2
  local target="$PWD/target"
  # Kept between runs: cargo's fingerprints include the path, so a second run rebuilds nothing.
  local tree="${TMPDIR:-/tmp}/trainyard-rev-$rev"
  [ -d "$tree" ] || git worktree add -f --detach "$tree" "$rev" >/dev/null
  # A commit's build never changes: kept beside its worktree once made.
  if [ -x "$tree.trainyard" ]; then
    cp "$tree.trainyard" "$dest"
    return
  fi
  echo "== building $rev"
  # Cargo names a workspace crate's artefacts by its path relative to the workspace root, so both
  # trees write the same files: make this tree's crates newer than what the other left there.
  find "$tree/crates" "$tree/tests" "$tree/migrations" "$tree/templates" "$tree/web" -type f -exec touch {} +
  (cd "$tree" && CARGO_TARGET_DIR="$target" cargo build --release --locked --bins -q)
  cp "$target/release/trainyard" "$tree.trainyard"
  cp "$tree.trainyard" "$dest"
}
