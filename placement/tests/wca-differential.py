"""Writes wca-differential.json for placement/tests/wca_differential.rs: seeded random cases
(clusters of 1-6 nodes over 1-3 shapes, 3-5 apps with tasks on them, candidates, each
algorithm's parameters) and the answers upstream's own classes give for them (filter's kept
nodes and reasons, prioritize's scores), run unchanged with a fake data provider.

Run with Python 3.6 from a checkout of intel/workload-collocation-agent @d4bf568, with
dataclasses, ruamel.yaml<0.16, colorlog, kazoo and requests installed:

    cd workload-collocation-agent && python3.6 /path/to/wca-differential.py > /path/to/wca-differential.json

The cases stay off the inputs on which wca raises (docs/placement.md, "Differences from
wca"): every app has a request and every node a capacity in every dimension, a DRAM hit ratio
and a type; StaticAssigner's counts never pass their targets; LeastUsed's weights name every
dimension in use.
"""
import json
import logging
import random
import sys

sys.path.insert(0, '.')

from wca.scheduler.types import ResourceType as rt, ExtenderArgs  # noqa: E402
from wca.scheduler.data_providers import DataProvider  # noqa: E402
from wca.scheduler.data_providers.score import NodeType  # noqa: E402
from wca.scheduler.algorithms.fit import Fit  # noqa: E402
from wca.scheduler.algorithms.bar import BAR  # noqa: E402
from wca.scheduler.algorithms.least_used import LeastUsed  # noqa: E402
from wca.scheduler.algorithms.least_used_bar import LeastUsedBAR  # noqa: E402
from wca.scheduler.algorithms.hierbar import HierBAR  # noqa: E402
from wca.scheduler.algorithms.dram_hit_ratio_provision import DramHitRatioProvision  # noqa
from wca.scheduler.algorithms.score import Score  # noqa: E402
from wca.scheduler.algorithms.static_assigner import StaticAssigner  # noqa: E402

logging.disable(logging.CRITICAL)


class Fake(DataProvider):
    """Serves one case's data as wca's cluster data providers would."""

    def __init__(self, c):
        self.c = c

    def get_nodes_capacities(self, dims):
        return {n: {d: cap[d.value] for d in dims} for n, cap in self.c['caps'].items()}

    def get_apps_counts(self):
        return {n: dict(self.c['assigned'].get(n, {})) for n in self.c['caps']}, {}

    def get_apps_requested_resources(self, dims):
        return {a: {d: s[d.value] for d in dims} for a, s in self.c['spec'].items()}

    def get_pmem_nodes(self):
        return [n for n, t in self.c['types'].items() if t == 'pmem']

    def get_dram_hit_ratio(self):
        return self.c['dram']

    def get_apps_profile(self):
        return self.c['profiles']

    def get_nodes_type(self):
        return {n: NodeType(t) for n, t in self.c['types'].items()}


def args(app, nodes):
    pod = {'metadata': {'labels': {'app': app}, 'name': 'p', 'namespace': 'default'}}
    return ExtenderArgs(Nodes=[], Pod=pod, NodeNames=nodes)


rnd = random.Random(30)
N = 40  # cases per algorithm
ALL = ['cpu', 'mem', 'membw_read', 'membw_write', 'wss']


def amount(lo, hi):
    return float(rnd.choice([rnd.randint(lo, hi), round(rnd.uniform(lo, hi), 1)]))


def gen(kind):
    dims = ['cpu', 'mem'] + rnd.choice([[], ['membw_read', 'membw_write'], ['wss'],
                                        ['membw_read', 'membw_write', 'wss']])
    nnodes = rnd.randint(1, 6)
    shapes = [{d: amount(2, 64) for d in ALL} for _ in range(rnd.randint(1, 3))]
    caps = {}
    for i in range(nnodes):
        s = dict(rnd.choice(shapes))
        if rnd.random() < 0.3:
            s['cpu'] = amount(2, 64)
        caps['n%d' % i] = s
    apps = ['a%d' % i for i in range(rnd.randint(3, 5))]
    spec = {a: {d: amount(0, 16) for d in ALL} for a in apps}
    assigned = {}
    for n in caps:
        assigned[n] = {}
        for a in apps:
            k = rnd.randint(0, 2)
            if k:
                assigned[n][a] = ['%s-%s-%d' % (a, n, j) for j in range(k)]
    profiles = {a: round(rnd.uniform(-5, 5), 3) for a in apps}
    types = {n: rnd.choice(['pmem', 'dram']) for n in caps}
    dram = {n: rnd.choice([1.0, 0.99, 0.96, 0.9]) for n in caps}
    app = rnd.choice(apps)
    cands = sorted(rnd.sample(sorted(caps), rnd.randint(1, nnodes)))
    params = {}
    if kind in ('LeastUsed', 'LeastUsedBAR'):
        flat = [d for d in dims if d not in ('membw_read', 'membw_write')]
        if 'membw_read' in dims:
            flat.append('membw_flat')
        params['least_used_weights'] = {d: float(rnd.randint(1, 3)) for d in flat}
    if kind in ('BAR', 'LeastUsedBAR') and rnd.random() < 0.5:
        params['bar_weights'] = {d: float(rnd.randint(0, 3)) for d in dims}
    if kind == 'LeastUsedBAR':
        params['least_used_weight'] = float(rnd.choice([0, 1, 2.5]))
    if kind == 'HierBAR':
        if rnd.random() < 0.5 and 'membw_read' in dims:
            params['merge_threshold'] = float(rnd.choice([0.5, 1, 1.5, 2]))
        if len(dims) < 2:
            dims = ['cpu', 'mem']
    if kind == 'Fit' and rnd.random() < 0.5:
        params['cpu_scale_factor'] = float(rnd.choice([0.5, 2]))
    if kind == 'DramHitRatioProvision':
        params['threshold'] = rnd.choice([0.97, 0.995])
    if kind == 'Score':
        params['score_target'] = rnd.choice([None, 1.0, -1.5])
        params['strict_mode_placement'] = rnd.random() < 0.5
    if kind == 'StaticAssigner':
        t = {}
        for n in caps:
            if rnd.random() < 0.8:
                t[n] = {a: len(assigned[n].get(a, [])) + rnd.randint(0, 1) for a in apps if rnd.random() < 0.8}
        params['targeted_assigned_apps_counts'] = t
    return dict(kind=kind, dims=dims, caps=caps, assigned=assigned, spec=spec, profiles=profiles,
                types=types, dram=dram, app=app, cands=cands, params=params)

CLS = dict(Fit=Fit, BAR=BAR, LeastUsed=LeastUsed, LeastUsedBAR=LeastUsedBAR, HierBAR=HierBAR,
           DramHitRatioProvision=DramHitRatioProvision, Score=Score, StaticAssigner=StaticAssigner)
out = []
for kind in CLS:
    for _ in range(N):
        c = gen(kind)
        dims = [rt(d) for d in c['dims']]
        p = Fake(c)
        kw = dict(c['params'])
        for k in ('least_used_weights', 'bar_weights'):
            if k in kw:
                kw[k] = {rt(d): v for d, v in kw[k].items()}
        try:
            alg = CLS[kind](data_provider=p, dimensions=dims, **kw)
            f = alg.filter(args(c['app'], list(c['cands'])))
            pr = alg.prioritize(args(c['app'], list(c['cands'])))
            # HierBAR's kept nodes come from a set: sorted, so that the file is the same each run.
            c['wca'] = dict(nodes=sorted(f.NodeNames), failed=f.FailedNodes,
                            scores=[[h.Host, h.Score] for h in pr])
        except Exception as e:
            c['wca'] = dict(raised=type(e).__name__)
        out.append(c)
json.dump(out, sys.stdout, separators=(',', ':'), sort_keys=True)
sys.stdout.write('\n')
