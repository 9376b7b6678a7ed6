"""The addresses train_multinode.sbatch gives paddle.distributed.launch: the rendezvous
(--master) and each node's own (--host), never a loopback address another node cannot
reach. Standard library only: it runs before anything else of the job, on every node.

    python node_address.py master REQUESTED FIRST_NODE [OTHER_NODE ...]
    python node_address.py host MASTER NODE_RANK

`master` (in the batch shell, which Slurm runs on the first node): REQUESTED (the
MASTER_ADDR knob, an address or a name; "" for none) when given, else the first node's
name resolved, else, where that name maps to a loopback address (Debian and Ubuntu put
the host's own name at 127.0.1.1 in /etc/hosts), this node's source address on the route
to another node of the job or on its default route.

`host` (on each node): for node rank 0, MASTER itself: the launcher starts its
rendezvous only where --master's IP is the string it holds as its own address (--host;
launch/controllers/master.py compares them, context/node.py would otherwise take
gethostbyname(getfqdn()), 127.0.1.1 on Debian); for the others, their source address on
the route to MASTER, which is where the master and the ranks reach them.

Prints the address; a loopback address where another node must reach it, or no address
at all, is refused in one line naming what to set, exit status 2. Loopback passes where
every node is this host: a job of one node, or MASTER_ADDR set to one by hand (as
tests/slurm_cluster.py's two slurmd on one host). IPv4 only: the launcher splits
--master at its colon and takes --host only when it holds a dot."""

import ipaddress
import socket
import sys

USER_ERROR = 2  # docs/guide.md, "Exit statuses": no restart fixes it
# The route lookup for the default route: a documentation address (RFC 5737), never a
# real host; connecting a UDP socket only picks the route, it sends nothing.
DEFAULT_ROUTE_PROBE = "203.0.113.1"
FIX = "set MASTER_ADDR to the first node's IPv4 address on the network the nodes share (`ip -4 -o addr show dev <interface>`)"


class AddressError(Exception):
    """No address another node can reach; the message names the fix."""


def is_loopback(address):
    return ipaddress.ip_address(address).is_loopback


def resolve(name):
    """The IPv4 addresses of ``name`` (an address resolves to itself), [] if none."""
    try:
        found = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return list(dict.fromkeys(entry[4][0] for entry in found))


def route_source(destination):
    """This host's source address on the route to ``destination`` (the kernel's choice, as
    `ip route get` shows it); None without a route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((destination, 9))
        except OSError:
            return None
        return probe.getsockname()[0]


def master_address(requested, first_node, other_nodes):
    if requested:
        found = resolve(requested)
        if not found:
            raise AddressError(
                f"MASTER_ADDR={requested} does not resolve to an IPv4 address: {FIX}"
            )
        return found[0]  # loopback accepted: set by hand, every node is this host
    addresses = resolve(first_node)
    routable = [a for a in addresses if not is_loopback(a)]
    if routable:
        return routable[0]
    # The name maps to loopback here, on the first node itself: ask the kernel which of
    # its addresses leads to the other nodes.
    peers = [a for node in other_nodes for a in resolve(node) if not is_loopback(a)]
    for destination in [*peers, DEFAULT_ROUTE_PROBE]:
        source = route_source(destination)
        if source and not is_loopback(source):
            return source
    if not other_nodes:  # a job of one node: nothing else must reach it
        return addresses[0] if addresses else "127.0.0.1"
    named = f"resolves to {', '.join(addresses)} (loopback)" if addresses else "does not resolve"
    raise AddressError(
        f"the first node {first_node} {named} and has no route to another node: the other "
        f"nodes could not reach the rendezvous; {FIX}"
    )


def node_host(master, node_rank):
    if int(node_rank) == 0:
        return master  # the string the launcher compares with --master's IP
    source = route_source(master)
    if not source:
        raise AddressError(f"node {node_rank} has no route to the master {master}: {FIX}")
    if is_loopback(source) and not is_loopback(master):
        raise AddressError(
            f"node {node_rank} reaches the master {master} only from the loopback address "
            f"{source}: the other nodes could not reach its ranks; {FIX}"
        )
    return source


def main(argv):
    try:
        if len(argv) >= 3 and argv[0] == "master":
            print(master_address(argv[1], argv[2], argv[3:]))
        elif len(argv) == 3 and argv[0] == "host":
            print(node_host(argv[1], argv[2]))
        else:
            print(__doc__.split("\n\n")[1], file=sys.stderr)
            return USER_ERROR
    except AddressError as problem:
        print(f"train_multinode.sbatch: {problem}", file=sys.stderr)
        return USER_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
