#!/usr/bin/env bash
# A redcron cluster on this machine: 3 redis-server nodes on loopback and 3 workers, with merged logs —
# a failover demo: kill a worker or a node while it runs, and the rest goes on.
#
# For trying redcron out and for the deploy test (tests/it/deploy.rs); not for production (see
# deploy/README.md for the recipes that are). Everything it starts runs in a directory of its own and is
# stopped when the script ends — Ctrl-C, --seconds elapsed, SIGTERM, or a failure — workers first, with
# SIGTERM, so that they finish their runs and release their leases while the nodes are still up; then
# the nodes. See --help.
set -euo pipefail

usage() {
	cat <<'EOF'
Usage: deploy/local-cluster.sh [OPTIONS]

Starts 3 redis-server nodes on loopback, with the persistence docs/protocol.md requires
(deploy/redis/redis.conf), and 3 redcron workers with a demo jobs file, each serving the dashboard
on a port of its own; prints their pids, a paste-ready `redcron status` command, and the workers'
merged logs until Ctrl-C or --seconds; then stops the workers (SIGTERM), then the nodes.

A failover demo: kill a worker (`kill -9 PID`) or a node, or pause one (`kill -STOP PID`, then
`kill -CONT PID`), while it runs. The script reports each worker or node that exits and goes on;
every tick still runs exactly once (`"$DIR/redcron" history ledger`, `"$DIR/redcron" explain ...`).
It stops by itself only when no worker is left.

Options:
  --dir DIR         put the nodes' data, the logs and the demo ledger in DIR (created if missing, kept
                    afterwards); default: a new temporary directory, removed afterwards unless --keep
  --keep            keep the temporary directory
  --seconds N       stop after N seconds, counted once every worker has started
  --workers N       number of workers (default 3)
  --base-port P     nodes on ports P..P+2, workers' dashboards on P+5.. (default: random free ports)
  --jobs FILE       the jobs file (default deploy/local-cluster.jobs.yaml); it can use ${REDCRON_NODE_1}
                    .. ${REDCRON_NODE_3}, ${REDCRON_DEMO_DIR} and ${REDCRON_WORKER_NAME}
  --format F        pretty: one short line per event (through jq if installed, else each raw line
                    after the worker's name); json: the workers' JSON lines as they are.
                    Default: pretty on a terminal, json otherwise
  --stop-timeout S  seconds the workers get to stop after SIGTERM before SIGKILL (default 40; keep it
                    above the jobs file's worker.shutdown_grace)
  -h, --help        print this help

Environment:
  REDCRON_BIN       the redcron binary; default target/release/redcron (or under
                    $CARGO_TARGET_DIR), built with `cargo build --release` if missing, not
                    rebuilt if present

In the directory: worker-N.log (each worker's output), redis-N/ (a node's data dir: its AOF and
redis.log), ledger (one line per run of the demo job `ledger`), env (the variables the jobs file
uses) and redcron (the binary with those variables set: `"$DIR/redcron" status`). The workers and
their jobs run there.

Exit status: 0 when --seconds elapsed and every worker still running then stopped cleanly (those
that exited before are reported when they do, and listed again at the end); 130 after Ctrl-C
(SIGINT), 143 after SIGTERM, 129 after SIGHUP; 1 when something did not start, no worker was left,
or a worker stopped uncleanly; 2 for a usage error.
EOF
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")

say() { printf 'local-cluster: %s\n' "$*" >&2; }
die() {
	say "error: $*"
	exit 1
}
usage_error() {
	say "$*; see --help"
	exit 2
}
number() { [[ $2 =~ ^[0-9]+$ ]] || usage_error "$1 expects a whole number, got '$2'"; }

dir="" keep=0 seconds="" workers=3 base_port="" format="" stop_timeout=40
jobs="$here/local-cluster.jobs.yaml"
while (($# > 0)); do
	case $1 in
	-h | --help)
		usage
		exit 0
		;;
	--keep)
		keep=1
		shift
		continue
		;;
	--dir | --seconds | --workers | --base-port | --jobs | --format | --stop-timeout)
		(($# >= 2)) || usage_error "$1 needs a value"
		;;
	*) usage_error "unknown argument '$1'" ;;
	esac
	case $1 in
	--dir) dir=$2 ;;
	--seconds) number "$1" "$2" && seconds=$2 ;;
	--workers) number "$1" "$2" && workers=$2 ;;
	--base-port) number "$1" "$2" && base_port=$2 ;;
	--jobs) jobs=$2 ;;
	--format) format=$2 ;;
	--stop-timeout) number "$1" "$2" && stop_timeout=$2 ;;
	esac
	shift 2
done
((workers >= 1)) || usage_error "--workers must be at least 1"
[[ -z $base_port ]] || ((base_port >= 1024 && base_port <= 65530)) || usage_error "--base-port must be in 1024..65530"
[[ -f $jobs ]] || usage_error "no jobs file at $jobs"
jobs=$(cd "$(dirname "$jobs")" && pwd)/$(basename "$jobs")
if [[ -z $format ]]; then
	if [[ -t 1 ]]; then format=pretty; else format=json; fi
fi
[[ $format == pretty || $format == json ]] || usage_error "--format is pretty or json, not '$format'"

for program in redis-server redis-cli; do
	command -v "$program" >/dev/null ||
		die "$program is not installed (Debian/Ubuntu: apt-get install -y redis-server)"
done

# The worker binary: REDCRON_BIN, or this checkout's release build (built now if missing).
if [[ -n ${REDCRON_BIN:-} ]]; then
	bin=$REDCRON_BIN
else
	target=${CARGO_TARGET_DIR:-target}
	[[ $target == /* ]] || target=$repo/$target
	bin=$target/release/redcron
	if [[ ! -x $bin ]]; then
		say "no $bin yet; building it with cargo build --release"
		(cd "$repo" && cargo build --release) >&2 || die "cargo build --release failed"
	fi
fi
[[ -f $bin && -x $bin ]] || die "the redcron binary $bin is not an executable file"
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")

remove_dir=0
if [[ -n $dir ]]; then
	mkdir -p "$dir" || die "cannot create $dir"
	dir=$(cd "$dir" && pwd)
else
	dir=$(mktemp -d "${TMPDIR:-/tmp}/redcron-cluster.XXXXXX")
	((keep)) || remove_dir=1
fi
# The workers, their jobs and the nodes all run here: relative paths in a jobs file land in this directory.
cd "$dir"

# Each node and worker runs in a session of its own (setsid), so that Ctrl-C in the terminal reaches only
# this script, which then stops them in order: workers first, while the nodes still answer their
# releases. With setpriv, the kernel also sends each of them SIGTERM if this script dies without
# cleaning up (SIGKILL). Both are util-linux; without them the script still works, less carefully.
detach=()
if command -v setsid >/dev/null; then detach+=(setsid); fi
if command -v setpriv >/dev/null && setpriv --help 2>&1 | grep -q -- --pdeathsig; then
	detach+=(setpriv --pdeathsig TERM)
fi

# jq renders an event as "time LEVEL worker event message field=value ..."; a line that is not JSON (a
# panic message) is printed after the worker's name.
# shellcheck disable=SC2016 # jq's own \(...) and $variables, not the shell's
jq_program='
def fields: to_entries
  | map(select(.key | IN("timestamp", "level", "worker", "event", "message") | not))
  | map("\(.key)=\(.value | if type == "string" then . else tojson end)")
  | join(" ");
. as $line
| (try fromjson catch null) as $e
| if ($e | type) == "object" then
    [($e.timestamp // "" | tostring | .[11:23]), ($e.level // "" | tostring | ascii_upcase),
     ($e.worker // $w | tostring), ($e.event // "-" | tostring), ($e.message // "" | tostring), ($e | fields)]
    | map(select(. != "")) | join(" ")
  else "\($w) | \($line)" end'
renderer=$format
if [[ $format == pretty ]] && command -v jq >/dev/null &&
	printf '{"event":"x"}\nnot json\n' | jq -R -r --arg w w "$jq_program" >/dev/null 2>&1; then
	renderer=jq
fi

# Shows worker-N.log (the worker's pid $1, log $2, name $3) on stdout until the worker has exited
# (tail --pid), whatever its jobs may still hold open. Ctrl-C reaches the viewers too (they stay in this
# script's process group); they ignore it so as to show the workers' last lines while they stop.
view() {
	trap '' INT
	tail -n +1 -f --pid="$1" "$2" | render "$3"
}

# Renders one worker's output (stdin) on stdout; $1 is the worker's name. One write per line, so
# that the lines of several workers do not interleave.
render() {
	case $renderer in
	jq) exec jq --unbuffered -R -r --arg w "$1" "$jq_program" ;;
	pretty) exec sed -u -e "s/^/$1 | /" ;;
	json) exec sed -u -e '' ;;
	esac
}

node_pids=() node_ports=() worker_pids=() worker_ports=() viewer_pids=()
# What exited before the stop ("worker-2 (pid 123): killed by SIGKILL"), reported as it happens.
gone_workers=() gone_nodes=() exited=() ended=
hurry=0

# Whether pid $1 is a running child of this script. Every signal below goes through this: a child that
# bash has already reaped leaves a pid that an unrelated process may get next, and must not be signalled.
running() {
	local stat state ppid
	# (Not $(<file): bash exits when that fails, whatever || follows.)
	read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
	stat=${stat##*) } # after the command name, which may hold spaces
	read -r state ppid _ <<<"$stat"
	[[ $ppid == "$$" && $state != Z ]]
}

# Whether any of the pids given is a running child.
alive() {
	local pid
	for pid in "$@"; do
		if running "$pid"; then return 0; fi
	done
	return 1
}

# Sends signal $1 to those of the pids given that are running children.
signal() {
	local sig=$1 pid
	shift
	for pid in "$@"; do
		if running "$pid"; then kill "-$sig" "$pid" 2>/dev/null; fi
	done
}

# Sends SIGTERM to the pids given, waits up to $1 seconds for them to exit, then SIGKILLs the rest.
terminate() {
	local timeout=$1 pid left child
	shift
	signal TERM "$@"
	for ((left = timeout * 10; left > 0; left--)); do
		alive "$@" || return 0
		sleep 0.1
	done
	for pid in "$@"; do
		if running "$pid"; then
			say "pid $pid did not stop within ${timeout}s; SIGKILL"
			# The jobs of a worker run in process groups of their own: take them down too.
			for child in $(pgrep -P "$pid"); do kill -KILL -- "-$child" "$child" 2>/dev/null; done
			kill -KILL "$pid" 2>/dev/null
		fi
	done
}

# A second Ctrl-C while stopping: SIGTERM the workers again, which tells them to stop their jobs now.
hurry_up() {
	((hurry)) && return
	hurry=1
	say "second signal: the workers stop their jobs now"
	signal TERM "${worker_pids[@]}"
}

cleanup() {
	local code=$? i status
	set +e
	trap hurry_up INT TERM HUP
	if ((${#worker_pids[@]} > 0)); then
		say "stopping ${#worker_pids[@]} workers (SIGTERM; they finish or stop their runs and release their leases)"
		terminate "$stop_timeout" "${worker_pids[@]}"
		for i in "${!worker_pids[@]}"; do
			[[ -z ${gone_workers[$i]:-} ]] || continue # reaped when it exited, and reported then
			wait "${worker_pids[$i]}"
			status=$?
			if ((status != 0)); then
				say "worker-$((i + 1)) exited with status $status"
				((code != 0)) || code=1
			fi
		done
	fi
	if ((${#exited[@]} > 0)); then
		say "exited before the stop: $(IFS=';' && printf '%s' "${exited[*]}" | sed 's/;/; /g')"
	fi
	# The viewers end soon after their worker; wait for them so that no line is lost.
	for ((i = 0; i < 50; i++)); do
		alive "${viewer_pids[@]}" || break
		sleep 0.1
	done
	signal TERM "${viewer_pids[@]}"
	if ((${#node_pids[@]} > 0)); then
		say "stopping the redis nodes (SIGTERM)"
		terminate 10 "${node_pids[@]}"
		wait "${node_pids[@]}" 2>/dev/null
	fi
	if ((remove_dir)); then
		cd / && rm -rf "$dir"
	else
		say "files kept in $dir"
	fi
	exit "$code"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# Starts node $1 (1-based) and waits until it answers as the process we started: a port taken by some
# other server (a race with another program) shows up as a different process_id, and we try another port.
start_node() {
	local i=$1 node_dir attempt port pid answer tries
	node_dir="$dir/redis-$i"
	mkdir -p "$node_dir"
	for attempt in 1 2 3 4 5 6 7 8 9 10; do
		if [[ -n $base_port ]]; then port=$((base_port + i - 1)); else port=$((20000 + RANDOM % 20000)); fi
		"${detach[@]}" redis-server "$here/redis/redis.conf" --port "$port" --bind 127.0.0.1 \
			--dir "$node_dir" --logfile "$node_dir/redis.log" --daemonize no </dev/null >/dev/null 2>&1 &
		pid=$!
		node_pids+=("$pid") # from now on, cleanup stops it
		for ((tries = 0; tries < 100; tries++)); do
			running "$pid" || break
			answer=$(redis-cli -p "$port" info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p') || true
			if [[ $answer == "$pid" ]]; then
				node_ports+=("$port")
				export "REDCRON_NODE_$i=redis://127.0.0.1:$port"
				return 0
			fi
			sleep 0.1
		done
		terminate 5 "$pid"
		wait "$pid" 2>/dev/null || true
		unset 'node_pids[-1]'
		[[ -z $base_port ]] || break
		say "redis node $i did not come up on port $port (attempt $attempt); trying another port"
	done
	say "the last lines of $node_dir/redis.log:"
	tail -n 20 "$node_dir/redis.log" >&2 || true
	die "redis node $i did not start"
}

# Whether something answers on 127.0.0.1 port $1.
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A port for worker $1's listener: --base-port's P+5+N-1, or a random one nothing answers on, below
# Linux's ephemeral range (32768 up), where the local end of an outgoing connection refuses no test
# connection but cannot be bound.
worker_port() {
	local port tries
	if [[ -n $base_port ]]; then
		echo $((base_port + 5 + $1 - 1))
		return
	fi
	for ((tries = 0; tries < 50; tries++)); do
		port=$((20000 + RANDOM % 12000))
		port_taken "$port" || {
			echo "$port"
			return
		}
	done
	die "found no free port for worker $1's listener"
}

# Starts worker $1 (1-based) with its output going to worker-N.log, and its viewer; again in its place
# (the same index) when it is started once more.
start_worker() {
	local name="worker-$1" log="$dir/worker-$1.log" pid port
	port=$(worker_port "$1")
	: >"$log" # before the viewer opens it
	REDCRON_WORKER_NAME=$name REDCRON_WORKER_PORT=$port "${detach[@]}" "$bin" run -c "$jobs" </dev/null >>"$log" 2>&1 &
	pid=$!
	worker_pids[$1 - 1]=$pid
	worker_ports[$1 - 1]=$port
	view "$pid" "$log" "$name" &
	viewer_pids+=("$!")
}

# Reaps pid $1, a child that has exited, and sets $ended to how it ended: "exit status N" or "killed by
# SIGNAME". (Not through $(...): a subshell cannot wait for this script's children.)
how_it_ended() {
	local status=0
	wait "$1" 2>/dev/null || status=$?
	if ((status > 128)); then
		ended="killed by SIG$(kill -l "$((status - 128))" 2>/dev/null || echo "$((status - 128))")"
	else
		ended="exit status $status"
	fi
}

# The paste-ready commands: env (the jobs file's variables) and redcron (the binary with them set), in
# the directory, so that `"$dir/redcron" status` asks the cluster from another terminal.
write_helpers() {
	local i
	{
		for i in 1 2 3; do printf 'REDCRON_NODE_%s=%q\n' "$i" "$(printenv "REDCRON_NODE_$i")"; done
		printf 'REDCRON_DEMO_DIR=%q\nREDCRON_WORKER_NAME=cli\nREDCRON_WORKER_PORT=9464\nREDCRON_CONFIG=%q\n' "$dir" "$jobs"
	} >"$dir/env"
	cat >"$dir/redcron" <<HELPER
#!/usr/bin/env bash
# redcron with the variables of the demo cluster in $dir (written by deploy/local-cluster.sh).
set -a
. $(printf '%q' "$dir/env")
set +a
exec $(printf '%q' "$bin") "\$@"
HELPER
	chmod +x "$dir/redcron"
}

# Waits until every worker has logged worker.started; a worker that exits first is a failure — unless its
# listener's port was taken meanwhile (another program bound it after worker_port looked), when it is
# started again on another port, up to 5 times.
await_workers() {
	local i tries attempts
	for i in "${!worker_pids[@]}"; do
		attempts=0
		for ((tries = 0; tries < 300; tries++)); do
			grep -q 'worker\.started' "$dir/worker-$((i + 1)).log" 2>/dev/null && continue 2
			if ! running "${worker_pids[$i]}"; then
				wait "${worker_pids[$i]}" 2>/dev/null || true
				if grep -q 'cannot listen on' "$dir/worker-$((i + 1)).log" && ((attempts < 5)) && [[ -z $base_port ]]; then
					attempts=$((attempts + 1))
					say "worker-$((i + 1))'s port ${worker_ports[$i]} was taken; starting it on another"
					start_worker $((i + 1))
					tries=0
					continue
				fi
				die "worker-$((i + 1)) exited before it started; see its output above"
			fi
			sleep 0.1
		done
		die "worker-$((i + 1)) did not log worker.started within 30s"
	done
}

export REDCRON_DEMO_DIR=$dir
for i in 1 2 3; do start_node "$i"; done
say "redis nodes up on 127.0.0.1 ports ${node_ports[*]} (appendonly yes, appendfsync always)"

write_helpers
# Check the jobs file once before starting workers, so that a mistake in it is reported once.
if ! check_output=$(REDCRON_WORKER_NAME=worker-1 REDCRON_WORKER_PORT=9464 "$bin" check -c "$jobs" 2>&1); then
	printf '%s\n' "$check_output" >&2
	die "$jobs does not pass 'redcron check'"
fi

for ((i = 1; i <= workers; i++)); do start_worker "$i"; done
await_workers
say "workers started: $workers ($bin); files in $dir"
for i in "${!worker_pids[@]}"; do
	say "  worker-$((i + 1)): pid ${worker_pids[$i]}, dashboard http://127.0.0.1:${worker_ports[$i]}/"
done
for i in "${!node_pids[@]}"; do
	say "  redis node $((i + 1)): pid ${node_pids[$i]}, port ${node_ports[$i]}"
done
say "ask the cluster from another terminal: \"$dir/redcron\" status   (or history ledger, explain ledger TICK)"
say "try a failover: kill -9 ${worker_pids[0]} (worker-1), or kill -9 ${node_pids[0]} (a node); the rest goes on"
if [[ -n $seconds ]]; then
	say "stopping in ${seconds}s"
else
	say "press Ctrl-C to stop"
fi

deadline=$((SECONDS + ${seconds:-0}))
while :; do
	for i in "${!worker_pids[@]}"; do
		[[ -z ${gone_workers[$i]:-} ]] || continue
		running "${worker_pids[$i]}" && continue
		how_it_ended "${worker_pids[$i]}"
		gone_workers[i]=$ended
		exited+=("worker-$((i + 1)) (pid ${worker_pids[$i]}): ${gone_workers[$i]}")
		say "worker-$((i + 1)) (pid ${worker_pids[$i]}) exited: ${gone_workers[$i]}; the other workers go on (its output: $dir/worker-$((i + 1)).log)"
	done
	((${#gone_workers[@]} < ${#worker_pids[@]})) || die "no worker is left"
	for i in "${!node_pids[@]}"; do
		[[ -z ${gone_nodes[$i]:-} ]] || continue
		running "${node_pids[$i]}" && continue
		how_it_ended "${node_pids[$i]}"
		gone_nodes[i]=$ended
		exited+=("redis node $((i + 1)) (pid ${node_pids[$i]}): ${gone_nodes[$i]}")
		say "redis node $((i + 1)) (pid ${node_pids[$i]}) exited: ${gone_nodes[$i]}; the workers go on with the other nodes (a majority is 2 of 3; its log: $dir/redis-$((i + 1))/redis.log)"
	done
	if [[ -n $seconds ]] && ((SECONDS >= deadline)); then
		say "${seconds}s elapsed"
		exit 0
	fi
	sleep 0.2
done
