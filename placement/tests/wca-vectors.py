"""Writes wca-vectors.json: the assertions of wca-scheduler's own tests (tests/scheduler of
intel/workload-collocation-agent @d4bf568) as data, for placement/tests/wca_vectors.rs.

Run with Python 3.6 from a checkout of that commit, with its test requirements (pytest,
dataclasses, ruamel.yaml<0.16, colorlog, kazoo, requests):

    cd workload-collocation-agent && python3.6 /path/to/wca-vectors.py > /path/to/wca-vectors.json

The expected values are read from upstream's test modules themselves (their parametrize lists
and the literals of the asserts, copied below where an assert is not parametrized), so the
file holds what upstream asserts, not what its code computes today. The data sets its mocked
data providers serve (node types, DRAM hit ratios, tasks per node, capacities, requests) are
taken from those providers.
"""
import enum
import json
import sys

sys.path.insert(0, '.')

import pytest  # noqa: E402
from wca.scheduler.types import ResourceType as rt  # noqa: E402

UPSTREAM = 'intel/workload-collocation-agent@d4bf568'


def plain(v):
    """JSON-able: enum keys and values as their value, approx as {approx, tolerance}."""
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, dict):
        return {plain(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        items = [plain(x) for x in v]
        return sorted(items) if isinstance(v, (set, frozenset)) else items
    if type(v).__name__ == 'ApproxScalar':
        return {'approx': v.expected, 'tolerance': v.tolerance}
    return v


def params(func):
    """The parametrize cases of an upstream test function, as dicts of argument name -> value."""
    out = []
    for mark in getattr(func, 'pytestmark', []):
        if mark.name != 'parametrize':
            continue
        names = [n.strip() for n in mark.args[0].split(',')]
        for values in mark.args[1]:
            if len(names) == 1:
                values = [values]
            out.append(dict(zip(names, values)))
    return out


cases = []


def case(test, kind, **fields):
    cases.append(dict(test=test, kind=kind, **{k: plain(v) for k, v in fields.items()}))


# --- tests/scheduler/algorithms/test_base.py -------------------------------------------------
from tests.scheduler.algorithms import test_base as tb  # noqa: E402

F = 'tests/scheduler/algorithms/test_base.py::'
case(F + 'test_sum_resources', 'sum', a=tb.build_resources(3, 3), b=tb.build_resources(2, 2),
     expect={'cpu': 5, 'mem': 5})
case(F + 'test_substract_resources', 'subtract', a=tb.build_resources(cpu=3, mem=3),
     b=tb.build_resources(cpu=2, mem=2), ratio=4.0, expect={'cpu': 1, 'mem': 1})
case(F + 'test_flat_membw_read_write', 'flatten', a=tb.build_resources(3, 3, 4, 1), ratio=4.0,
     expect={'cpu': 3, 'mem': 3, 'membw_flat': 8.0})
case(F + 'test_divide_resources', 'divide', a=tb.build_resources(3, 3, 4, 1),
     b=tb.build_resources(2, 2, 8, 2), ratio=4.0,
     expect={'cpu': 3.0 / 2.0, 'mem': 3.0 / 2.0, 'membw_flat': 0.5})
case(F + 'test_used_free_requested_and_requested_fraction', 'used_free_requested',
     dimensions=['cpu', 'mem'], app='app1', node='node1',
     apps_spec={'app1': {'cpu': 2, 'mem': 2}, 'app2': {'cpu': 1, 'mem': 1}},
     node_capacities={'node1': {'cpu': 20, 'mem': 20}},
     assigned_apps={'node1': {'app2': ['app2_0', 'app2_1', 'app2_2', 'app2_3', 'app2_4',
                                       'app2_5']}},
     expect={'used': {'cpu': 6, 'mem': 6}, 'free': {'cpu': 14, 'mem': 14},
             'requested': {'cpu': 2, 'mem': 2}, 'capacity': {'cpu': 20, 'mem': 20},
             'membw_read_write_ratio': None, 'requested_fraction': {'cpu': 0.4, 'mem': 0.4}})
for p in params(tb.test_used_resources_on_node):
    case(F + 'test_used_resources_on_node', 'used_on_node', dimensions=p['dimensions'],
         assigned_apps=p['assigned_apps'], apps_spec=p['apps_spec'], expect=p['expected'])
for p in params(tb.test_get_nodes_used_resources):
    case(F + 'test_get_nodes_used_resources', 'nodes_used', dimensions=p['dimensions'],
         apps_on_node=p['apps_on_node'], apps_spec=p['apps_spec'], expect=p['expected'])

# --- test_bar.py, test_least_used.py ----------------------------------------------------------
from tests.scheduler.algorithms import test_bar, test_least_used  # noqa: E402

for p in params(test_bar.test_calculate_variance):
    case('tests/scheduler/algorithms/test_bar.py::test_calculate_variance', 'variance',
         fractions=list(p['requested_fraction'].items()), weights=p['bar_weights'],
         expect=p['expected_variance'])
for p in params(test_least_used.test_least_used_score):
    case('tests/scheduler/algorithms/test_least_used.py::test_least_used_score',
         'least_used_score', fractions=list(p['requested_fraction'].items()),
         weights=p['weights'], expect=p['expected_score'])

# --- test_hierbar.py --------------------------------------------------------------------------
from tests.scheduler.algorithms import test_hierbar as th  # noqa: E402

F = 'tests/scheduler/algorithms/test_hierbar.py::'
# Upstream names the dimensions x, y, z here; the fixture maps them onto cpu, mem, wss (the
# same sort order), as verwalter has only its six dimensions.
XYZ = {'x': 'cpu', 'y': 'mem', 'z': 'wss'}


def xyz(resources):
    return {XYZ[k]: v for k, v in resources.items()}


for p in params(th.test_calc_average_resources_of_nodes):
    case(F + 'test_calc_average_resources_of_nodes', 'class_mean',
         resources=[xyz(r) for r in p['list_of_resources']], expect=xyz(p['expected_avg']))
for p in params(th.test_resources_to_shape):
    case(F + 'test_resources_to_shape', 'shape', resources=xyz(p['resources']),
         expect=[[XYZ[k], v] for k, v in p['expected_shape']])
for p in params(th.test_shape_diff):
    case(F + 'test_shape_diff', 'shape_diff', first=xyz(p['resources1']),
         second=xyz(p['resources2']), expect=p['expected_diff'])
for p in params(th.test_merge_shapes):
    case(F + 'test_merge_shapes', 'merge_shapes', merge_threshold=p['merge_threshold'],
         nodes=p['nodes'], expect=p['expected_shapes_number'])

# --- the mocked cluster of the data provider tests -------------------------------------------
from tests.scheduler.data_providers import test_cluster_score_data_provider as tcs  # noqa: E402

dp = tcs.get_mocked_cluster_data_provider()
dims = [rt.CPU, rt.MEM]
apps_on_node, _ = dp.get_apps_counts()
cluster = dict(
    node_capacities=dp.get_nodes_capacities(dims),
    assigned_apps=apps_on_node,
    apps_spec=dp.get_apps_requested_resources(dims),
    nodes={n: dict(node_type=t) for n, t in dp.get_nodes_type().items()},
    app_profiles=dp.get_apps_profile(),
)
for n, r in dp.get_dram_hit_ratio().items():
    cluster['nodes'].setdefault(n, {})['platform_dram_hit_ratio'] = r

# --- test_dram_hit_ratio_provision.py ---------------------------------------------------------
from tests.scheduler.algorithms import test_dram_hit_ratio_provision as td  # noqa: E402

for p in params(td.test_app_fit_node):
    case('tests/scheduler/algorithms/test_dram_hit_ratio_provision.py::test_app_fit_node',
         'dram_fit_node', snapshot='cluster', threshold=0.995, node=p['node_name'],
         app=p['app_name'], expect=list(p['expected_output']))

# --- test_score.py ----------------------------------------------------------------------------
from tests.scheduler.algorithms import test_score as ts  # noqa: E402

F = 'tests/scheduler/algorithms/test_score.py::'
for p in params(ts.test_get_app_node_type):
    case(F + 'test_get_app_node_type', 'score_node_type', app_profiles=dict(p['apps_profile']),
         app=p['app_name'], score_target=p['score_target'], expect=p['result'])
# test_app_fit_node_type: the algorithms are built in the parametrize list; their score_target
# is None and SCORE_TARGET in this order.
for p, target in zip(params(ts.test_app_fit_node_type), [None, ts.SCORE_TARGET]):
    case(F + 'test_app_fit_node_type', 'score_fit_node_type', snapshot='cluster',
         score_target=target, app='mysql-hammerdb-small', node_type='pmem',
         expect=list(p['expected']))
for p in params(ts.test_app_fit_nodes):
    case(F + 'test_app_fit_nodes', 'score_app_fit_nodes', snapshot='cluster',
         score_target=ts.SCORE_TARGET, strict_mode_placement=False, nodes=p['node_names'],
         app=p['app_name'], expect={'nodes': p['expected'], 'failed': {}})
case(F + 'test_reschedule', 'score_reschedule', snapshot='cluster', score_target=None,
     expect=['memcached-mutilate-big-wss-1', 'redis-memtier-big-0', 'redis-memtier-big-wss-0',
             'specjbb-preset-big-120-0'])
for p in params(ts.test_strict_mode_placement):
    case(F + 'test_strict_mode_placement', 'score_app_fit_nodes', snapshot='cluster',
         score_target=ts.SCORE_TARGET, strict_mode_placement=p['strict_mode'],
         nodes=p['nodes'], app='memcached-mutilate-big', expect={'nodes': p['expected']})

# --- test_simulator.py ------------------------------------------------------------------------
F = 'tests/scheduler/test_simulator.py::'
case(F + 'test_single_run', 'run_until_first_failure', algorithm='Fit',
     dimensions=['cpu', 'mem'],
     nodes={'0': {'cpu': 96, 'mem': 1000}, '1': {'cpu': 96, 'mem': 320}},
     task={'cpu': 8, 'mem': 10}, expect=25)
for alg, count in (('Fit', 14), ('LeastUsedBAR', 14)):
    case(F + 'test_single_run_membw_write_read', 'run_until_first_failure', algorithm=alg,
         dimensions=['cpu', 'mem', 'membw_read', 'membw_write'],
         nodes={'0': {'cpu': 96, 'mem': 1000, 'membw_read': 40, 'membw_write': 10},
                '1': {'cpu': 96, 'mem': 320, 'membw_read': 150, 'membw_write': 150}},
         task={'cpu': 8, 'mem': 10, 'membw_write': 5, 'membw_read': 5}, expect=count)

# --- experiments/test_experiments.py -----------------------------------------------------------
from tests.scheduler.simulator.nodesets import NODES_DEFINITIONS_2TYPES  # noqa: E402
from tests.scheduler.simulator.nodes_generators import prepare_nodes  # noqa: E402
from tests.scheduler.simulator.task_generators import TaskGeneratorClasses  # noqa: E402
from tests.scheduler.simulator.tasksets import TASKS_2TYPES  # noqa: E402

# test_experiment_static_assigner: its nodes, and its tasks in the order the simulator gets them
# (the generator pops from the end of its list); the figures its assert compares, except the
# labels (ALGO, NODES, SIM, TASKS) and the per-AEP-node figures, which our report has not.
dim2 = {rt.CPU, rt.MEM}
nodes = prepare_nodes(NODES_DEFINITIONS_2TYPES, dict(aep=1, dram=1), dim2)
gen = TaskGeneratorClasses(task_definitions=TASKS_2TYPES, counts=dict(cputask=2, memtask=2),
                           dimensions=dim2)
tasks = [t.get_core_name() for t in reversed(gen.tasks)]
case('tests/scheduler/experiments/test_experiments.py::test_experiment_static_assigner',
     'simulate',
     nodes={n.name: n.initial.data for n in nodes},
     apps_spec={t.name: t.requested.data for t in gen.task_definitions},
     tasks=tasks, algorithm='StaticAssigner', dimensions=['cpu', 'mem'],
     targeted_assigned_apps_counts={'aep_0': {'cputask': 1, 'memtask': 2},
                                    'dram_0': {'cputask': 1, 'memtask': 0}},
     expect={'assigned%': 100, 'assigned_broken%': 0, 'balance': 0.8671381944444445,
             'cpu_util%': 50.0, 'mem_util%': 40.26845637583892, 'scheduled': 4,
             'utilization%': 45})

# The assertions of tests/scheduler not carried over, and why.
T = 'tests/scheduler/'
left_out = [
    dict(test=T + 'algorithms/test_dram_hit_ratio_provision.py::test_app_fit_node', assertions=2,
         why='the second assert of each case checks the wca_scheduler_node_dram_hit_ratio_'
             'can_schedule metric in wca\'s metric registry; verwalter keeps no per-decision '
             'metric (its decision and reason, the first assert, are carried over)'),
    dict(test=T + 'experiments/test_experiments.py::test_experiment_static_assigner',
         assertions=1,
         why='of its result, the labels (ALGO, NODES, SIM, TASKS: names wca\'s report makes) and '
             'cpu_util(AEP)%, mem_util(AEP)% (a mean over nodes named aep*) are not figures our '
             'report has; len(results) == 1 counts the harness\'s runs. The other figures are '
             'carried over'),
    dict(test=T + 'experiments/test_experiments.py::test_experiment_score', assertions=2,
         why='its 9 tasks are first bound to dram_0 by node_name, then moved by the simulator\'s '
             'loop of Score.reschedule and retry_scheduling over 20 iterations, with app '
             'profiles the harness makes from the requests (normalized by MEM); verwalter\'s '
             'simulator has no binding, rescheduling loop or profile making (Score\'s decisions '
             'and reschedule are carried over from test_score.py)'),
    dict(test=T + 'experiments/test_experiments.py::test_experiment_fit', assertions=2,
         why='its one iteration places one task bound to dram_0 by node_name: no algorithm '
             'decides anything in it'),
    dict(test=T + 'experiments/test_experiments.py::test_experiment_bar', assertions=1,
         why='len(results) == 4 counts the harness\'s runs, no algorithm figure'),
    dict(test=T + 'experiments/test_experiments.py::test_experiment_hierbar', assertions=1,
         why='len(results) == 15 counts the harness\'s runs, no algorithm figure'),
    dict(test=T + 'data_providers/test_cluster_data_provider.py', assertions=None,
         why='the data provider reading Kubernetes and Prometheus answers (covered by '
             'placement/src/sources tests), not an algorithm\'s decision or arithmetic'),
    dict(test=T + 'data_providers/test_cluster_score_data_provider.py', assertions=None,
         why='as test_cluster_data_provider.py; its APPS_PROFILE and NODE_TYPES are used as the '
             '"cluster" snapshot here'),
    dict(test=T + 'test_metrics.py', assertions=None,
         why='wca\'s metric registry, which verwalter does not have'),
    dict(test=T + 'test_server.py', assertions=1,
         why='wca\'s mutating webhook (_mutate_pod, its pod annotations); verwalter has no '
             'webhook'),
    dict(test=T + 'test_types.py', assertions=None,
         why='no assert: pytest.raises checks of wca\'s wire types refusing bad values; our '
             'request decoding is tested in placement/src/extender'),
    dict(test=T + 'test_utils.py', assertions=None, why='no assert'),
]

json.dump(dict(upstream=UPSTREAM, snapshots=dict(cluster=plain(cluster)), cases=cases,
               left_out=left_out),
          sys.stdout, indent=1, sort_keys=True)
sys.stdout.write('\n')
