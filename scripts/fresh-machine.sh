#!/usr/bin/env bash
# Prove the README's two commands (`make demo`, `make test`) on a truly fresh Debian 13 machine.
#
# It builds a clean Debian 13 (trixie) root with debootstrap (the default variant plus make, nothing
# else: the project's own make targets must install everything they need), clones the project's
# committed HEAD into /root/gpulab of it and runs each command there as root, in a pid and mount
# namespace of its own but on this machine's network (the package registries must be reachable).
# Everything it mounts and every process it starts is gone when it exits; the root is removed too,
# unless --keep. Run `scripts/fresh-machine.sh --help` for the details.
set -euo pipefail

readonly SUITE=trixie
readonly SUITE_NAME="Debian 13"
readonly DEFAULT_ROOT=/var/tmp/gpulab-fresh-root
readonly DEFAULT_COMMANDS=("make demo" "make test")
# The file that says "this script made this root": only such a root is ever removed.
readonly MARKER=.gpulab-fresh-machine
# Where the clone lives inside the root, and the environment the commands get there.
readonly PROJECT_DIR=/root/gpulab
readonly INNER_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# This machine's variables that reach the commands (when set): CI, proxies, pip's registry settings.
readonly PASS_ENV=(CI http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY
  PIP_CERT PIP_DEFAULT_TIMEOUT PIP_INDEX_URL PIP_EXTRA_INDEX_URL)

self=$(realpath -- "${BASH_SOURCE[0]}")
readonly self

usage() {
  cat <<EOF
Usage: scripts/fresh-machine.sh [--root DIR] [--keep] [--] [COMMAND ...]

Runs each COMMAND (one shell command line each, default: 'make demo' then 'make test') with bash -c
in a clone of this project on a truly fresh $SUITE_NAME ($SUITE) machine, and says how each one ended:
  fresh-machine: 'make demo' exited 0 after 123 s
Every command runs, even after one fails; the exit code is non-zero when any of them failed.
Example: scripts/fresh-machine.sh -- 'make test'

  --root DIR  where the machine's root is built (default: $DEFAULT_ROOT).
              An existing DIR must be empty, or a root this script made earlier (which is
              removed and built again).
  --keep      leave the root in DIR afterwards, to look around (default: it is removed)

Needs root, debootstrap (apt package debootstrap), python3 and the network. What it does:
 1. debootstrap $SUITE into DIR from the Debian mirror this machine's apt uses (else
    deb.debian.org): the default variant plus make, nothing else.
 2. copies in this machine's registry settings, not project state: its CA certificates
    (/etc/ssl/certs/ca-certificates.crt, and /usr/local/share/ca-certificates so that they survive
    the root's own ca-certificates install), /etc/resolv.conf and /etc/pip.conf if there is one.
 3. clones this repository with git clone --no-local into $PROJECT_DIR of the root (and copies
    the shared/ folder beside the repository, if there is one, beside the clone). Only
    the committed HEAD is cloned: uncommitted changes, staged or not, and untracked files are NOT
    part of the run.
 4. runs the commands as root in /root/gpulab of the root (pivot_root: it is the namespace's own
    root), in a pid, mount and cgroup namespace of their own, on this machine's network, with a
    clean environment: HOME, PATH, LANG,
    TERM and, where set here, only CI, the proxy variables and PIP_CERT, PIP_DEFAULT_TIMEOUT,
    PIP_INDEX_URL, PIP_EXTRA_INDEX_URL. /proc, /sys (cgroup2 at /sys/fs/cgroup) and /dev are
    mounted; /run, /tmp and /dev/shm are fresh; stdin is /dev/null.
 5. afterwards (also when interrupted): ends every process the commands started, unmounts all it
    mounted and removes DIR (unless --keep), never across a mount.
EOF
}

say() { printf 'fresh-machine: %s\n' "$*"; }
die() {
  say "$*" >&2
  exit 1
}
usage_error() {
  say "$* (scripts/fresh-machine.sh --help says how to call it)" >&2
  exit 2
}

# mounts_at_or_below DIR: the mount points of this mount namespace at DIR or below it, one a line.
# (DIR never holds blanks or backslashes, so a mount point below it starts with DIR/ even when
# mountinfo escapes characters of the rest of its path.)
mounts_at_or_below() {
  local dir=$1 _id _parent _dev _fsroot mnt _rest
  while read -r _id _parent _dev _fsroot mnt _rest; do
    if [[ $mnt == "$dir" || $mnt == "$dir"/* ]]; then
      printf '%s\n' "$mnt"
    fi
  done </proc/self/mountinfo
}

# find_mirror: the Debian mirror this machine's apt is set up with, as the lab's guest image takes it
# (labsim.net.guest_image.machine_mirror: standard library only, so the machine's python3 runs it).
find_mirror() {
  PYTHONPATH="${self%/*}/../library" python3 -c \
    'from labsim.net.guest_image import machine_mirror; print(machine_mirror())'
}

# cgroup2_mount: where this machine mounts the cgroup2 hierarchy (/sys/fs/cgroup or, on a hybrid
# machine, /sys/fs/cgroup/unified), if anywhere.
cgroup2_mount() {
  local line left right mnt
  while IFS= read -r line; do
    left=${line%% - *} right=${line#* - }
    if [[ ${right%% *} == cgroup2 ]]; then
      read -r _ _ _ _ mnt _ <<<"$left"
      printf '%s\n' "$mnt"
      return
    fi
  done </proc/self/mountinfo
}

# spawn CMD...: start CMD in the background, in this run's cgroup where there is one (a cgroup that
# holds every process of the run, so that "none is left" can be checked); its pid goes to $spawned.
# (Background, so that a signal to this script runs its traps at once instead of after CMD.) CMD is
# killed when this script dies, even of SIGKILL (setpriv --pdeathsig): CMD is always an
# `unshare --pid --kill-child`, so everything it started goes with it.
spawned=''
spawn() {
  if [[ -n $run_cgroup ]]; then
    # shellcheck disable=SC2016 # $1 and $@ are the inner shell's
    "$BASH" -c 'echo 0 >"$1/cgroup.procs" && shift && exec "$@"' fresh-machine "$run_cgroup" \
      setpriv --pdeathsig KILL "$@" &
  else
    setpriv --pdeathsig KILL "$@" &
  fi
  spawned=$!
}

# reap: wait for the spawned command; its exit status goes to $reaped.
reaped=0
reap() {
  reaped=0
  wait "$spawned" || reaped=$?
  spawned=''
}

# is_empty_dir DIR: whether DIR holds nothing, dot files included.
is_empty_dir() {
  local -a entries
  entries=("$1"/* "$1"/.[!.]* "$1"/..?*)
  local entry
  for entry in "${entries[@]}"; do
    [[ -e $entry || -L $entry ]] && return 1
  done
  return 0
}

# lab_objects: the simulated lab's objects in this machine's network namespace (links named gl + 3 hex
# digits, its blackhole routes of metric 4242), one a line: the run's labs make them here, since the
# fresh machine shares this machine's network.
lab_objects() {
  ip -o link show | sed -nE 's/^[0-9]+: (gl[0-9a-f]{3}[^:@]*)[:@].*/link \1/p'
  ip route show table all type blackhole | sed -nE 's/^blackhole ([0-9./]+) .*metric 4242.*/route \1/p'
}

# remove_new_lab_objects: what lab_objects lists now and did not before the run (an interrupted run's
# labs); the machine's own labs, there before, stay.
remove_new_lab_objects() {
  local kind name
  while read -r kind name; do
    [[ -n $kind ]] || continue
    grep -qxF "$kind $name" <<<"$lab_objects_before" && continue
    say "removing what a lab of the run left in this machine's network: $kind $name"
    if [[ $kind == link ]]; then
      ip link del "$name" 2>/dev/null
    else
      ip route del blackhole "$name" metric 4242 2>/dev/null
    fi
  done <<<"$(lab_objects)"
}

# ---------------------------------------------------------------------------------------------------
# Inside: the first process of the run's pid namespace (pid 1; its mount and cgroup namespaces are
# the run's own, its network is this machine's). It mounts the machine's file systems into the root,
# then runs each command there; when it exits, the kernel ends every process left in the namespace
# and the mount namespace takes all its mounts with it.
# ---------------------------------------------------------------------------------------------------
inside() {
  local root=$1 results=$2 cmd line var start rc failed=0  # $results: a path inside the root
  shift 2
  (($$ == 1)) || die "--inside is internal: it runs as pid 1 of the namespace the script makes"

  mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
  mount --rbind /sys "$root/sys"
  # A fresh machine's cgroup2 hierarchy at /sys/fs/cgroup (Debian 13's systemd has nothing else),
  # whatever this machine mounts there; seen from the cgroup namespace, its root is this run's cgroup.
  if mountpoint -q "$root/sys/fs/cgroup"; then
    umount -R "$root/sys/fs/cgroup"
  fi
  mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$root/sys/fs/cgroup"
  mount --rbind /dev "$root/dev"
  mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs "$root/dev/shm"
  mount -t tmpfs -o nosuid,nodev,mode=755 tmpfs "$root/run"
  mkdir -m 1777 "$root/run/lock"
  mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs "$root/tmp"
  # The root becomes this namespace's own root (pivot_root, not only a chroot), as on a real machine:
  # a process that enters a mount namespace made inside (nsenter -m, as tests/lab/k3s does) lands at that
  # namespace's root, which must be the fresh machine's and not this one's.
  cd "$root"
  mkdir .fresh-machine-oldroot
  pivot_root . .fresh-machine-oldroot
  cd /
  umount -l /.fresh-machine-oldroot
  rmdir /.fresh-machine-oldroot

  local -a inner_env=(HOME=/root "PATH=$INNER_PATH" LANG=C.UTF-8 TERM=dumb)
  for var in "${PASS_ENV[@]}"; do
    if [[ -v $var ]]; then
      inner_env+=("$var=${!var}")
    fi
  done
  for cmd in "$@"; do
    start=$SECONDS
    rc=0
    # --default-signal: the signals a background job of this script ignores (SIGINT, SIGQUIT) are
    # back to their defaults, as on a fresh machine.
    /usr/bin/env -i --default-signal --chdir="$PROJECT_DIR" "${inner_env[@]}" \
      /bin/bash -c "$cmd" </dev/null || rc=$?
    line=$(printf "'%s' exited %d after %d s" "$cmd" "$rc" $((SECONDS - start)))
    say "$line"
    printf '%s\n' "$line" >>"$results"
    ((rc == 0)) || failed=1
  done
  # `make demo` leaves its lab running, as for a user; the lab's bridge and route live in this
  # machine's network namespace, which outlives the fresh one: stop it as the README says.
  if [[ -e $PROJECT_DIR/.lab/lab.json ]]; then
    rc=0
    /usr/bin/env -i --chdir="$PROJECT_DIR" "${inner_env[@]}" .venv/bin/gpulab lab down </dev/null || rc=$?
    line=$(printf "'.venv/bin/gpulab lab down' (the lab make demo left running) exited %d" "$rc")
    say "$line"
    printf '%s\n' "$line" >>"$results"
    ((rc == 0)) || failed=1
  fi
  return "$failed"
}

# ---------------------------------------------------------------------------------------------------
# Outside: build the root, fill it, enter it, and clean up.
# ---------------------------------------------------------------------------------------------------
root='' keep=0 root_made=0 self_bound=0 run_cgroup='' results='' run_rc=0 lab_objects_before=''

debootstrap_log='' keep_debootstrap_log=0
summary=()
commands=()

# cleanup (EXIT trap): end the run's processes, unmount, remove the root (unless --keep).
cleanup() {
  local rc=$? mounts waited procs gone=''
  trap - EXIT INT TERM HUP
  set +e
  # An interrupted run: killing unshare kills the namespace's pid 1 (--kill-child), which ends the
  # whole pid namespace.
  if [[ -n $spawned ]]; then
    kill -KILL "$spawned" 2>/dev/null
    wait "$spawned" 2>/dev/null
  fi
  if [[ -n $run_cgroup ]]; then
    for ((waited = 0; waited < 100; waited++)); do
      grep -qx 'populated 0' "$run_cgroup/cgroup.events" && break
      sleep 0.1
    done
    if grep -qx 'populated 0' "$run_cgroup/cgroup.events"; then
      gone="no process of the run is left"
      find "$run_cgroup" -depth -type d -exec rmdir -- {} +
      [[ -e $run_cgroup ]] && say "could not remove the run's cgroup $run_cgroup" >&2
    else
      procs=$(<"$run_cgroup/cgroup.procs")
      say "processes of the run are still alive (cgroup $run_cgroup): ${procs//$'\n'/ }" >&2
      rc=1
    fi
  fi
  [[ -n $lab_objects_before ]] && remove_new_lab_objects
  if ((self_bound)); then
    umount "$root" 2>/dev/null || umount -l "$root" || say "could not unmount $root" >&2
  fi
  [[ -n $results ]] && rm -f -- "$results"
  [[ -n $debootstrap_log ]] && ((!keep_debootstrap_log)) && rm -f -- "$debootstrap_log"
  if ((root_made)); then
    mounts=$(mounts_at_or_below "$root")
    if [[ -n $mounts ]]; then
      say "NOT removing $root: still mounted there: ${mounts//$'\n'/ }" >&2
      rc=1
    elif ((keep)); then
      say "cleaned up: ${gone:+$gone, }nothing is mounted in $root, kept (--keep) to look around"
    else
      rm -rf --one-file-system -- "$root" || rc=1
      if [[ -e $root ]]; then
        say "could not remove all of $root" >&2
      else
        say "cleaned up: ${gone:+$gone, }nothing was mounted in $root, removed it"
      fi
    fi
  fi
  exit "$rc"
}

# interrupted SIGNAL STATUS: a signal's trap; the EXIT trap cleans up.
interrupted() {
  say "interrupted by SIG$1: ending the run and cleaning up" >&2
  exit "$2"
}

# prepare_root: an empty, marked $root (removing one this script made earlier).
prepare_root() {
  if [[ -e $root || -L $root ]]; then
    [[ -d $root && ! -L $root ]] || die "$root exists and is not a directory: refusing to touch it"
    if [[ -e $root/$MARKER ]]; then
      local mounts owner
      owner=$(sed -n 's/^pid=//p' "$root/$MARKER")
      if [[ -n $owner ]] && kill -0 "$owner" 2>/dev/null; then
        die "$root is in use by another run (pid $owner, alive): refusing to touch it"
      fi
      mounts=$(mounts_at_or_below "$root")
      if [[ -n $mounts ]]; then
        # A run killed with SIGKILL leaves its self-bind mount behind (its namespaces, and every
        # process and mount in them, ended with it).
        say "unmounting what a killed earlier run left mounted in $root: ${mounts//$'\n'/ }"
        umount -R "$root" 2>/dev/null || umount -R -l "$root"
        mounts=$(mounts_at_or_below "$root")
        [[ -z $mounts ]] || die "$root (an earlier run's root) still has mounts: ${mounts//$'\n'/ }"
      fi
      say "removing the root an earlier run left in $root"
      rm -rf --one-file-system -- "$root"
    elif ! is_empty_dir "$root"; then
      die "$root exists, is not empty and is not a root this script made (no $MARKER in it): refusing to touch it"
    fi
  fi
  mkdir -p -- "$root"
  chmod 755 "$root"
  root_made=1
  printf 'made by gpulab scripts/fresh-machine.sh (its next run removes it)\npid=%s\n' "$$" >"$root/$MARKER"
}

# build_root: debootstrap, in a pid and mount namespace of its own (its mounts and processes cannot
# outlive it).
build_root() {
  local mirror start
  mirror=$(find_mirror)
  debootstrap_log=$(mktemp /tmp/fresh-machine-debootstrap.XXXXXX.log)
  say "building a clean $SUITE_NAME ($SUITE) root in $root from $mirror (debootstrap: default variant" \
    "+ make; its output goes to $debootstrap_log)"
  start=$SECONDS
  spawn unshare --mount --propagation private --pid --fork --kill-child \
    debootstrap --include=make "$SUITE" "$root" "$mirror" >"$debootstrap_log" 2>&1
  reap
  if ((reaped != 0)); then
    tail -n 30 "$debootstrap_log" >&2
    [[ -f $root/debootstrap/debootstrap.log ]] && cp -- "$root/debootstrap/debootstrap.log" "$debootstrap_log.full"
    keep_debootstrap_log=1
    die "debootstrap failed (exit $reaped) after $((SECONDS - start)) s: its output is in $debootstrap_log" \
      "(and its own log, if it wrote one, in $debootstrap_log.full)"
  fi
  summary+=("$SUITE_NAME root built in $((SECONDS - start)) s")
  say "${summary[-1]}"
}

# copy_machine_settings: the machine's registry settings (CA certificates, DNS, pip's CA bundle).
copy_machine_settings() {
  local bundle=/etc/ssl/certs/ca-certificates.crt local_cas=/usr/local/share/ca-certificates
  if [[ -f $bundle ]]; then
    mkdir -p "$root${bundle%/*}"
    cp --remove-destination -L -- "$bundle" "$root$bundle"
  else
    say "note: this machine has no $bundle to copy"
  fi
  # ca-certificates (which the project installs) writes the bundle again from its own list and
  # this directory's: so the machine's own CAs (a registry's, a proxy's) stay in it.
  if [[ -d $local_cas ]]; then
    mkdir -p "$root$local_cas"
    cp -a -- "$local_cas/." "$root$local_cas/"
  fi
  cp --remove-destination -L -- /etc/resolv.conf "$root/etc/resolv.conf"
  if [[ -f /etc/pip.conf ]]; then
    cp --remove-destination -L -- /etc/pip.conf "$root/etc/pip.conf"
  fi
}

# clone_project: the repository this script lives in, at its committed HEAD, into $PROJECT_DIR.
clone_project() {
  local repo head cloned dest=$root$PROJECT_DIR status
  # (safe.directory: this script only reads the repository, whoever owns it)
  local -a git=(git -c safe.directory='*')
  repo=$("${git[@]}" -C "${self%/*}" rev-parse --show-toplevel)
  head=$("${git[@]}" -C "$repo" rev-parse HEAD)
  "${git[@]}" clone -q --no-local -- "$repo" "$dest"
  cloned=$("${git[@]}" -C "$dest" rev-parse HEAD)
  if [[ $cloned != "$head" ]]; then # (a detached HEAD: the clone took the default branch)
    "${git[@]}" -C "$dest" checkout -q --detach "$head"
  fi
  cloned=$("${git[@]}" -C "$dest" log -1 --format='%h (%s)')
  say "cloned $repo at $cloned into $PROJECT_DIR"
  # shared/ (the project's reference data, which some tests read) sits beside the clone, as in CI
  if [[ -d $repo/../shared ]]; then
    cp -a -- "$repo/../shared" "$root${PROJECT_DIR%/*}/shared"
    say "copied $(realpath -- "$repo/../shared") beside it"
  fi
  status=$("${git[@]}" -C "$repo" status --porcelain)
  if [[ -n $status ]]; then
    mapfile -t status <<<"$status"
    say "note: ${#status[@]} uncommitted paths in $repo are NOT in the clone: this run proves the commit only"
  fi
}

# make_run_cgroup: a cgroup (below this script's own) that will hold every process of the run.
make_run_cgroup() {
  local mnt own
  mnt=$(cgroup2_mount)
  if [[ -z $mnt ]]; then
    say "note: this machine mounts no cgroup2 hierarchy: the run gets the kernel's whole one"
    return
  fi
  own=$(sed -n 's/^0:://p' /proc/self/cgroup)
  # The empty cgroups of earlier runs killed with SIGKILL (the pid in the name is gone).
  local stale
  for stale in "$mnt${own%/}"/gpulab-fresh-machine.*; do
    [[ -d $stale ]] || continue
    kill -0 "${stale##*.}" 2>/dev/null && continue
    grep -qx 'populated 0' "$stale/cgroup.events" || continue
    find "$stale" -depth -type d -exec rmdir -- {} + 2>/dev/null || true
  done
  if mkdir -- "$mnt${own%/}/gpulab-fresh-machine.$$"; then
    run_cgroup=$mnt${own%/}/gpulab-fresh-machine.$$
  else
    say "note: no cgroup of its own for the run (cgroup2 at $mnt is not writable): the run gets the kernel's whole hierarchy"
  fi
}

# run_commands: enter the root (a mount point of its own, so that `ip netns` works inside) and run
# the commands there; the exit status of the run inside goes to $run_rc.
run_commands() {
  local i
  local -a lines
  lab_objects_before=$(lab_objects)$'\n'
  mount --bind "$root" "$root"
  self_bound=1
  mount --make-private "$root"
  results=$root/.fresh-machine-results
  : >"$results"
  # --cgroup only when the run has a cgroup of its own: the namespace's cgroup root is then that one.
  local -a ns=(--mount --propagation private --pid --fork --kill-child)
  [[ -n $run_cgroup ]] && ns+=(--cgroup)
  spawn unshare "${ns[@]}" -- "$BASH" "$self" --inside "$root" /.fresh-machine-results "${commands[@]}"
  reap
  run_rc=$reaped
  mapfile -t lines <"$results"
  summary+=("${lines[@]}")
  # A command that has no line did not run: the namespace ended before it (setup failed).
  for ((i = ${#lines[@]}; i < ${#commands[@]}; i++)); do
    summary+=("'${commands[i]}' did not run (the run inside ended with exit $run_rc first)")
  done
}

main() {
  while (($#)); do
    case $1 in
      --root)
        (($# >= 2)) || usage_error "--root needs a directory"
        root=$2
        shift 2
        ;;
      --root=*)
        root=${1#--root=}
        shift
        ;;
      --keep)
        keep=1
        shift
        ;;
      -h | --help)
        usage
        exit 0
        ;;
      --)
        shift
        break
        ;;
      -*) usage_error "unknown option: $1" ;;
      *) break ;;
    esac
  done
  if (($#)); then
    commands=("$@")
  else
    commands=("${DEFAULT_COMMANDS[@]}")
  fi

  ((EUID == 0)) || die "must run as root (it runs debootstrap, mounts and pivot_root)"
  local tool
  for tool in debootstrap:debootstrap unshare:util-linux setpriv:util-linux pivot_root:util-linux git:git python3:python3; do
    command -v "${tool%%:*}" >/dev/null ||
      die "${tool%%:*} is not installed: install the apt package ${tool#*:} (apt-get install ${tool#*:})"
  done
  [[ -n $root ]] || root=$DEFAULT_ROOT
  root=$(realpath -m -- "$root")
  [[ $root != / && ! $root =~ [[:space:]\\] ]] || die "--root must not be / or hold blanks or backslashes: $root"

  trap cleanup EXIT
  trap 'interrupted HUP 129' HUP
  trap 'interrupted INT 130' INT
  trap 'interrupted TERM 143' TERM

  local line
  make_run_cgroup
  prepare_root
  build_root
  copy_machine_settings
  clone_project
  run_commands
  say "summary:"
  for line in "${summary[@]}"; do
    say "  $line"
  done
  ((run_rc == 0)) || exit 1
}

if [[ ${1-} == --inside ]]; then
  shift
  inside "$@"
else
  main "$@"
fi
