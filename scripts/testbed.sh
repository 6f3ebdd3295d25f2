#!/usr/bin/env bash
# A multi-host test bed on one machine: K network namespaces ("hosts"),
# each with one veth link per rail into that rail's bridge, the bridges
# living in their own "switch" namespace, optionally shaped; L ranks per
# host, R rails (default 1).
#
#   scripts/testbed.sh up K L [--rails R] [--delay 20us] [--rate 10gbit] [--name NAME] [--owner PID]
#   scripts/testbed.sh run [--name NAME] [--env VAR=VALUE]... -- CMD [ARGS...]
#   scripts/testbed.sh down [--name NAME]
#   scripts/testbed.sh with K L [up options] [--env VAR=VALUE]... -- CMD [ARGS...]
#   scripts/testbed.sh sweep      # removes beds whose creator has exited
#
# Shape. Namespaces are called NAME-sw (the switch) and NAME-h0 ...
# NAME-h<K-1> (the hosts), NAME being rccl-tb-<pid of "up">-<random> unless
# given. Host i has one interface per rail r, tb<r>, with
# 10.231.<r>.<i+1>/24, whose peer (port p<i> on rail 0, p<i>r<r> on the
# others) is enslaved to the rail's bridge br<r> in the switch namespace:
# each rail is its own network, as on a rail-optimized fabric.
# Nothing is created in the caller's namespace and no address is routed
# outside the bed; every host also has its loopback up.
#
# Shaping (when --delay or --rate is given) happens at two egress points
# per direction of each of a host's links (so R rails give a host R times
# the rate), like a full-duplex NIC behind a switch:
#   * host side, tb0 egress: netem "delay D rate R" (the whole one-way
#     delay D and the host's send rate R);
#   * switch side, p<i> egress (towards host i): tbf "rate R", no delay,
#     so a host also receives at most R however many hosts send to it.
# A message from host a to host b thus sees one-way latency D (RTT 2D,
# plus the kernel's own few microseconds) and a bottleneck of R per host
# in each direction. Kernels without sch_netem (CONFIG_NET_SCH_NETEM)
# cannot add delay: the host side then falls back to tbf "rate R", a
# warning says so, and the state file records delay=none.
#
# "up --owner PID" marks the bed as belonging to process PID (a script
# that runs "down" itself): if PID dies without doing so, the next "up" or
# "sweep" removes the bed; beds without an owner stay until "down".
# "up" writes the bed's description to $RCCL_TB_DIR/NAME.env (default
# /run/rccl-testbed) and prints how to run ranks. "run" starts K*L
# processes, rank r on host r/L, each inside its host's namespace with
# RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR (host 0's
# address), MASTER_PORT, NCCL_SOCKET_IFNAME=tb0 and NCCL_HOSTID=host<i>,
# waits for all of them, prints each exit code and exits non-zero if any
# failed (rank output goes to this script's stdout/stderr, unprefixed).
# "with" is up + run + down, tearing the bed down even on failure or ^C.
# Without --name, "run" and "down" use $RCCL_TB or, if exactly one bed
# exists, that one.
set -euo pipefail

STATE_DIR=${RCCL_TB_DIR:-/run/rccl-testbed}
SUBNET_BASE=10.231
SUBNET=$SUBNET_BASE.0
IFACE=tb0

die() { echo "testbed: $*" >&2; exit 1; }

# The bed to remove when this script exits, however it exits.
CLEANUP_NAME=""
RUN_PIDS=()
on_exit() {
    if [ ${#RUN_PIDS[@]} -gt 0 ]; then
        kill -TERM "${RUN_PIDS[@]}" 2>/dev/null || true
    fi
    if [ -n "$CLEANUP_NAME" ]; then
        teardown "$CLEANUP_NAME"
    fi
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

need_tools() {
    [ "$(id -u)" = 0 ] || die "must run as root (network namespaces)"
    command -v ip >/dev/null || die "'ip' is missing (apt-get install iproute2)"
    command -v tc >/dev/null || die "'tc' is missing (apt-get install iproute2)"
}

netem_available() {
    # Probes sch_netem on a throwaway dummy link inside a throwaway namespace.
    local ns="$1-probe" ok=1
    ip netns add "$ns" || return 1
    if tc -n "$ns" qdisc add dev lo root netem delay 1us 2>/dev/null; then
        ok=0
    fi
    ip netns del "$ns" || true
    return $ok
}

# Removes every namespace and state file of bed $1.
teardown() {
    local name=$1 ns
    # Stop what still runs inside the bed's namespaces, then delete them.
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${name}-(sw|h[0-9]+|probe)$" || true); do
        local pids
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        if [ -n "$pids" ]; then
            # shellcheck disable=SC2086
            kill -TERM $pids 2>/dev/null || true
            sleep 0.2
            # shellcheck disable=SC2086
            kill -KILL $pids 2>/dev/null || true
        fi
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -f "$STATE_DIR/$name.env"
}

# Removes beds named rccl-tb-<pid>-* whose creating process has exited
# (left behind by a SIGKILLed run); beds made by a plain "up" (OWNER=none
# in their state file) stay until "down".
sweep() {
    local name pid
    for name in $(ip netns list 2>/dev/null | awk '{print $1}' |
        sed -nE 's/^(rccl-tb-([0-9]+)-[A-Za-z0-9]+)-(sw|h[0-9]+|probe)$/\1/p' | sort -u); do
        pid=$(echo "$name" | sed -E 's/^rccl-tb-([0-9]+)-.*/\1/')
        if grep -qx OWNER=none "$STATE_DIR/$name.env" 2>/dev/null; then
            continue
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "testbed: removing stale bed $name" >&2
            teardown "$name"
        fi
    done
}

cmd_up() {
    local k=${1:-} l=${2:-}
    shift 2 || die "usage: up K L [--delay D] [--rate R] [--name NAME]"
    [[ "$k" =~ ^[0-9]+$ && "$k" -ge 1 && "$k" -le 200 ]] || die "K must be 1..200"
    [[ "$l" =~ ^[0-9]+$ && "$l" -ge 1 ]] || die "L must be at least 1"
    local delay="" rate="" name="" owner="" keep=1 rails=1
    while [ $# -gt 0 ]; do
        case $1 in
            --rails) rails=$2; shift 2 ;;
            --delay) delay=$2; shift 2 ;;
            --rate) rate=$2; shift 2 ;;
            --name) name=$2; shift 2 ;;
            --owner) owner=$2; shift 2 ;;
            --ephemeral) keep=0; owner=$$; shift ;;
            *) die "unknown option $1" ;;
        esac
    done
    [[ "$rails" =~ ^[0-9]+$ && "$rails" -ge 1 && "$rails" -le 16 ]] || die "--rails must be 1..16"
    [ -n "$name" ] || name="rccl-tb-${owner:-$$}-$(head -c4 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    [[ "$name" =~ ^[A-Za-z0-9-]+$ ]] || die "bad name $name"
    need_tools
    sweep
    mkdir -p "$STATE_DIR"
    [ ! -e "$STATE_DIR/$name.env" ] || die "bed $name exists"
    # Half-built beds are removed on any failure.
    CLEANUP_NAME=$name

    local sw="$name-sw" i ns r
    ip netns add "$sw"
    ip -n "$sw" link set lo up
    for ((r = 0; r < rails; r++)); do
        ip -n "$sw" link add "br$r" type bridge
        ip -n "$sw" link set "br$r" up
    done
    local use_netem=0 delay_note=none
    if [ -n "$delay" ] || [ -n "$rate" ]; then
        if netem_available "$name"; then
            use_netem=1
        elif [ -n "$delay" ]; then
            echo "testbed: WARNING: this kernel has no sch_netem: --delay $delay is NOT applied; shaping rate only (tbf)" >&2
        fi
    fi
    [ "$use_netem" = 1 ] && [ -n "$delay" ] && delay_note=$delay
    for ((i = 0; i < k; i++)); do
        ns="$name-h$i"
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        for ((r = 0; r < rails; r++)); do
            local dev="tb$r" port="p$i"
            [ "$r" = 0 ] || port="p${i}r$r"
            ip -n "$sw" link add "$port" type veth peer name "$dev" netns "$ns"
            ip -n "$sw" link set "$port" master "br$r"
            ip -n "$sw" link set "$port" up
            ip -n "$ns" addr add "$SUBNET_BASE.$r.$((i + 1))/24" dev "$dev"
            ip -n "$ns" link set "$dev" up
            if [ "$use_netem" = 1 ]; then
                tc -n "$ns" qdisc add dev "$dev" root netem limit 100000 \
                    ${delay:+delay "$delay"} ${rate:+rate "$rate"}
            elif [ -n "$rate" ]; then
                tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst 256kb latency 100ms
            fi
            if [ -n "$rate" ]; then
                tc -n "$sw" qdisc add dev "$port" root tbf rate "$rate" burst 256kb latency 100ms
            fi
        done
    done
    # Wait until every host reaches host 0 (bridge ports forwarding).
    for ((i = 1; i < k; i++)); do
        local tries=0
        command -v ping >/dev/null || { sleep 0.5; break; }
        until ip netns exec "$name-h$i" ping -c1 -W1 "$SUBNET.1" >/dev/null 2>&1; do
            tries=$((tries + 1))
            [ $tries -lt 20 ] || die "host $i cannot reach host 0"
            sleep 0.1
        done
    done
    cat >"$STATE_DIR/$name.env" <<EOF
NAME=$name
HOSTS=$k
RANKS_PER_HOST=$l
RAILS=$rails
MASTER_ADDR=$SUBNET.1
IFACE=$([ "$rails" = 1 ] && echo "$IFACE" || echo tb)
DELAY=$delay_note
RATE=${rate:-none}
SHAPER=$([ "$use_netem" = 1 ] && echo netem || { [ -n "$rate" ] && echo tbf || echo none; })
OWNER=${owner:-none}
EOF
    # A plain "up" keeps the bed; "with" removes it when it exits.
    [ "$keep" = 0 ] || CLEANUP_NAME=""
    echo "testbed: $name: $k hosts x $l ranks x $rails rail(s) (delay ${delay_note}, rate ${rate:-unshaped} per rail); host i is namespace $name-h<i>, tb<r> $SUBNET_BASE.<r>.<i+1>"
    if [ "$keep" = 1 ]; then
        echo "testbed: run ranks with:  RCCL_TB=$name $0 run -- CMD [ARGS...]"
        echo "testbed: remove with:     RCCL_TB=$name $0 down"
    fi
}

pick_bed() {
    local name=$1
    if [ -z "$name" ]; then
        name=${RCCL_TB:-}
    fi
    if [ -z "$name" ]; then
        local beds
        beds=$(ls "$STATE_DIR" 2>/dev/null | sed -n 's/\.env$//p')
        [ "$(echo "$beds" | grep -c .)" = 1 ] || die "say which bed with --name or RCCL_TB (beds: ${beds:-none})"
        name=$beds
    fi
    [ -f "$STATE_DIR/$name.env" ] || die "no bed $name"
    echo "$name"
}

cmd_run() {
    local name="" envs=()
    while [ $# -gt 0 ]; do
        case $1 in
            --name) name=$2; shift 2 ;;
            --env) envs+=("$2"); shift 2 ;;
            --) shift; break ;;
            *) break ;;
        esac
    done
    [ $# -gt 0 ] || die "usage: run [--name NAME] [--env VAR=VALUE]... -- CMD [ARGS...]"
    name=$(pick_bed "$name")
    # shellcheck disable=SC1090
    . "$STATE_DIR/$name.env"
    local world=$((HOSTS * RANKS_PER_HOST)) port pids=() rank
    port=${MASTER_PORT:-$((20000 + RANDOM % 20000))}
    for ((rank = 0; rank < world; rank++)); do
        local host=$((rank / RANKS_PER_HOST))
        ip netns exec "$NAME-h$host" env \
            RANK=$rank WORLD_SIZE=$world \
            LOCAL_RANK=$((rank % RANKS_PER_HOST)) LOCAL_WORLD_SIZE=$RANKS_PER_HOST \
            MASTER_ADDR="$MASTER_ADDR" MASTER_PORT="$port" \
            NCCL_SOCKET_IFNAME="$IFACE" NCCL_HOSTID="host$host" \
            "${envs[@]}" "$@" &
        pids+=($!)
        RUN_PIDS=("${pids[@]}")
    done
    local failed=0 codes=()
    for ((rank = 0; rank < world; rank++)); do
        local rc=0
        wait "${pids[$rank]}" || rc=$?
        codes+=("$rc")
        [ "$rc" = 0 ] || failed=1
    done
    RUN_PIDS=()
    echo "testbed: exit codes by rank: ${codes[*]}" >&2
    return $failed
}

cmd_down() {
    local name=""
    [ "${1:-}" = --name ] && name=$2
    name=$(pick_bed "$name")
    teardown "$name"
    echo "testbed: removed $name" >&2
}

cmd_with() {
    local k=$1 l=$2 up=() run=()
    shift 2
    while [ $# -gt 0 ]; do
        case $1 in
            --delay | --rate | --rails) up+=("$1" "$2"); shift 2 ;;
            --env) run+=("$1" "$2"); shift 2 ;;
            --) shift; break ;;
            *) break ;;
        esac
    done
    cmd_up "$k" "$l" "${up[@]}" --ephemeral >&2
    cmd_run --name "$CLEANUP_NAME" "${run[@]}" -- "$@"
}

case ${1:-} in
    up) shift; cmd_up "$@" ;;
    run) shift; cmd_run "$@" ;;
    down) shift; need_tools; cmd_down "$@" ;;
    with) shift; need_tools; cmd_with "$@" ;;
    sweep) need_tools; sweep ;;
    *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2 ;;
esac
