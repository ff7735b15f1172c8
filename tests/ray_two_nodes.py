"""Two Ray nodes on this machine, as Ray's own tests make them (``ray.cluster_utils.Cluster``), for the
cluster tests: prints one JSON line (the head's address, both node ids), then obeys lines on stdin:
``remove`` takes the second node away at once (its raylet and workers die, as when a machine is lost),
``add`` starts a new second node. End of input shuts the cluster down."""

import json
import sys

from ray.cluster_utils import Cluster


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    second = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    print(
        json.dumps({"address": cluster.address, "head": cluster.head_node.node_id, "second": second.node_id}),
        flush=True,
    )
    for line in sys.stdin:
        if line.strip() == "remove":
            cluster.remove_node(second, allow_graceful=False)
            print(json.dumps({"removed": second.node_id}), flush=True)
        elif line.strip() == "add":
            second = cluster.add_node(num_cpus=2)
            cluster.wait_for_nodes()
            print(json.dumps({"second": second.node_id}), flush=True)
    cluster.shutdown()


if __name__ == "__main__":
    main()
