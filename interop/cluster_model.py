#!/usr/bin/env python3
"""Where a lanemq cluster tops out, one log stream against a log in partitions
(docs/cluster.md, "Past one stream").

    python3 interop/cluster_model.py [--replica-us 1.9] [--front-us 2.9] [--nats-us 4.2]
        [--cores 2] [--record-bytes 166] [--rf 3] [--fanout-subs-per-node 0.0]

Inputs are CPU microseconds per record measured on this machine (interop/bench-cluster.sh,
docs/benchmarks.md): what a node spends to append and index a record it only replicates
(`replica_us`), what the node a client publishes to spends on top (MQTT in, PUBACK, the
frame out: `front_us`), and what the JetStream servers spend per record all together at R3
(`nats_us`). The model is a plain CPU budget: a node saturates when its cores are busy.

One stream: every node appends and indexes every record, so the cluster's ingest is what one
node can replicate, whatever the node count. Partitioned: the log is P streams (P = nodes),
each record is stored and indexed by `rf` nodes (its partition's replicas); a node reads the
other partitions only for the subscribers it has (modelled as a share of the records it must
deliver without storing them, at a third of `replica_us`).
"""
import argparse


def one_stream(n, a):
    # Per record: every node replicates it; one node is the front; nats at R3 (the stream has
    # 3 replicas whatever n is).
    cpu_per_record = n * a.replica_us + a.front_us + a.nats_us
    # The busiest node: replicates every record, plus its share of the fronts, plus a share of
    # nats (one nats-server per lanemq node, 3 of them replicas of the one stream).
    busiest = a.replica_us + a.front_us / n + a.nats_us / 3
    per_node_limit = a.cores * 1e6 / busiest
    total_limit = n * a.cores * 1e6 / cpu_per_record
    return min(per_node_limit, total_limit), cpu_per_record


def partitioned(n, a):
    p = n
    rf = min(a.rf, n)
    # Each record is stored by rf nodes, fronted by one, and read (not stored) by the nodes with
    # matching subscribers (fanout share), and costs nats its R3 share.
    read_only = max(0.0, a.fanout_subs_per_node * (n - rf))
    cpu_per_record = rf * a.replica_us + a.front_us + a.nats_us + read_only * a.replica_us / 3
    total_limit = n * a.cores * 1e6 / cpu_per_record
    return total_limit, cpu_per_record, p


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replica-us", type=float, default=1.9)
    ap.add_argument("--front-us", type=float, default=2.9)
    ap.add_argument("--nats-us", type=float, default=4.2)
    ap.add_argument("--cores", type=float, default=2)
    ap.add_argument("--record-bytes", type=float, default=166)
    ap.add_argument("--rf", type=int, default=3)
    ap.add_argument("--fanout-subs-per-node", type=float, default=0.0,
                    help="share of the other partitions' records each node must read for its subscribers")
    a = ap.parse_args()
    print("| nodes | one stream: records/s | CPU µs per record | disk per record (all nodes) "
          "| partitioned: records/s | CPU µs per record | disk per record (all nodes) |")
    print("|---|---|---|---|---|---|---|")
    for n in (3, 10, 100):
        r1, c1 = one_stream(n, a)
        r2, c2, _ = partitioned(n, a)
        d1 = n * a.record_bytes
        d2 = min(a.rf, n) * a.record_bytes
        print("| %d | %.0fk | %.1f | %.1f kB | %.0fk | %.1f | %.2f kB |" % (
            n, r1 / 1e3, c1, d1 / 1e3, r2 / 1e3, c2, d2 / 1e3))


if __name__ == "__main__":
    main()
