# SPDX-License-Identifier: Apache-2.0
# Verify every pack under a prefix and convert its members to another dtype,
# one task per pack, on a Dask cluster (python3-distributed): a LocalCluster
# of --workers processes here, or the cluster whose scheduler --scheduler names.
#   python3 dask_fanout.py s3://corpus/bf16/ s3://corpus/e4m3/ --dtype e4m3 [--workers 2 | --scheduler tcp://HOST:8786]
import argparse

from dask.distributed import Client, LocalCluster

import kvfile


def fan_out(client, src, dst, dtype):
    packs = kvfile.walk(src, [".kvpack"])  # s3://corpus/bf16/a.kvpack, ...
    outs = [dst + p[len(src):] for p in packs]
    return client.gather(client.map(kvfile.convert_pack, packs, outs, dtype=dtype, pure=False))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--dtype", default="e4m3")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--scheduler")
    a = ap.parse_args()
    if a.scheduler:
        cluster = None
        client = Client(a.scheduler)
    else:
        cluster = LocalCluster(n_workers=a.workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    for r in fan_out(client, a.src, a.dst, a.dtype):
        print(f"{r['src']} -> {r['dst']}: {r['members']} members, {r['tokens']} tokens verified and converted")
    client.close()
    if cluster is not None:
        cluster.close()
