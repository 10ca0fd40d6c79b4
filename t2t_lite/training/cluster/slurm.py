"""A SLURM job step as a cluster: what t2t-trainer reads instead of TF_CONFIG when
`srun` started it.

srun starts one process per task and tells each its rank (SLURM_PROCID), the step's
task count (SLURM_STEP_NUM_TASKS), nodes (SLURM_STEP_NODELIST, in SLURM's hostlist
syntax: "gpu[08-10],big7") and tasks per node (SLURM_STEP_TASKS_PER_NODE: "2(x3),1").
The cluster is the one TensorFlow's SlurmClusterResolver describes: one "worker" per
task, node after node, the k-th task of a node listening on port_base + k. Its two
parsers of SLURM's syntax (pure Python: no `scontrol` needed) are reused; the
cluster itself is assembled here, because the resolver's cluster_spec()

- orders the nodes by name as strings ("node10" before "node9") while SLURM numbers
  tasks in its node list's order, so on such nodes ranks would take each other's
  addresses and the workers would never meet;
- assumes srun's block distribution without checking it (here SLURM_LOCALID and
  SLURMD_NODENAME must agree with the place computed, or it is one line);
- counts GPUs with nvidia-smi and rewrites CUDA_VISIBLE_DEVICES, where SLURM
  (`--gpus-per-task`) has already given each task its GPUs, which
  MultiWorkerMirroredStrategy uses as it does under TF_CONFIG.

The result is a TF_CONFIG (training/cluster/distribution.py checks it as the user's and sets
it), so everything after start-up is the TF_CONFIG path.
"""

from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (
    expand_hostlist,
    expand_tasks_per_node,
)

from t2t_lite.errors import UserError

DEFAULT_PORT = 8888  # SlurmClusterResolver's port_base
_STEP_VARIABLES = (
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
)


def is_multi_task_step(environ):
    """Whether this process is one task of a SLURM step of several (what
    --cluster=auto takes for a cluster when TF_CONFIG is unset). An sbatch script
    itself is not: it runs once, with no step variables."""
    tasks = environ.get("SLURM_STEP_NUM_TASKS", "").strip()
    return "SLURM_PROCID" in environ and tasks not in ("", "0", "1")


class SlurmStep:
    """The step as srun describes it to this task: its nodes, every task's
    (node, place on the node), and this task's rank."""

    def __init__(self, environ, port_base=DEFAULT_PORT):
        for name in _STEP_VARIABLES:
            if not environ.get(name, "").strip():
                raise UserError(
                    f"--cluster=slurm: {name} is not set, so this is not a task of a "
                    "SLURM job step; start t2t-trainer with srun (in an sbatch script "
                    "or an salloc allocation), which starts one per task."
                )
        self.job = environ.get("SLURM_JOB_ID", "?")
        self.step = environ.get("SLURM_STEP_ID", "?")
        self.nodelist = environ["SLURM_STEP_NODELIST"].strip()
        self.rank = _integer(environ, "SLURM_PROCID")
        self.num_tasks = _integer(environ, "SLURM_STEP_NUM_TASKS")
        self.nodes = _parsed(expand_hostlist, "SLURM_STEP_NODELIST", self.nodelist)
        per_node = _parsed(
            expand_tasks_per_node,
            "SLURM_STEP_TASKS_PER_NODE",
            environ["SLURM_STEP_TASKS_PER_NODE"].strip(),
        )
        self._check_counts(per_node)
        # Block distribution, as srun places tasks by default: node after node.
        self.places = [
            (node, k) for node, n in zip(self.nodes, per_node) for k in range(n)
        ]
        self._check_place(environ)
        last = port_base + max(per_node) - 1
        if port_base < 1 or last > 65535:
            raise UserError(
                f"cluster_port {port_base}: with {max(per_node)} task(s) on a node the "
                f"ports would be {port_base} to {last}; they must lie in 1-65535."
            )
        self.addresses = [f"{node}:{port_base + k}" for node, k in self.places]

    def _check_counts(self, per_node):
        if len(set(self.nodes)) != len(self.nodes):
            raise UserError(
                f"SLURM_STEP_NODELIST {self.nodelist!r} names a node twice; every "
                "node needs its own entry."
            )
        if len(per_node) != len(self.nodes):
            raise UserError(
                f"SLURM_STEP_TASKS_PER_NODE gives task counts for {len(per_node)} "
                f"node(s) but SLURM_STEP_NODELIST {self.nodelist!r} names "
                f"{len(self.nodes)}."
            )
        if self.num_tasks < 1:
            raise UserError(
                f"SLURM_STEP_NUM_TASKS is {self.num_tasks}: the step has no tasks."
            )
        if sum(per_node) != self.num_tasks:
            raise UserError(
                f"SLURM_STEP_NUM_TASKS is {self.num_tasks} but "
                f"SLURM_STEP_TASKS_PER_NODE places {sum(per_node)} task(s) on "
                f"{self.nodelist}."
            )
        if not 0 <= self.rank < self.num_tasks:
            raise UserError(
                f"SLURM_PROCID {self.rank} is outside the step's {self.num_tasks} "
                f"task(s) (0 to {self.num_tasks - 1})."
            )

    def _check_place(self, environ):
        """This task runs where the block layout puts it (when SLURM says where:
        SLURMD_NODENAME, SLURM_LOCALID); another layout (--distribution=cyclic,
        arbitrary) would give two tasks one address."""
        node, k = self.places[self.rank]
        actual_node = environ.get("SLURMD_NODENAME", node).strip()
        actual_k = environ.get("SLURM_LOCALID", str(k)).strip()
        if (actual_node, actual_k) != (node, str(k)):
            raise UserError(
                f"SLURM task {self.rank} runs on {actual_node} as local task "
                f"{actual_k}, but t2t_lite numbers tasks node after node in "
                f"SLURM_STEP_NODELIST's order, which puts it on {node} as local task "
                f"{k}; start the step with srun's default --distribution=block."
            )

    def tf_config(self):
        """The TF_CONFIG dict of this task: every task a worker, in rank order."""
        return {
            "cluster": {"worker": self.addresses},
            "task": {"type": "worker", "index": self.rank},
        }

    def describe(self):
        ports = sorted({int(a.rsplit(":", 1)[1]) for a in self.addresses})
        port_text = str(ports[0]) if len(ports) == 1 else f"{ports[0]}-{ports[-1]}"
        return (
            f"SLURM job {self.job} step {self.step}, {self.num_tasks} task(s) on "
            f"{self.nodelist} (port {port_text})"
        )


def _integer(environ, name):
    value = environ[name].strip()
    try:
        return int(value)
    except ValueError:
        raise UserError(f"{name} must be an integer, got {value!r}.") from None


def _parsed(parse, name, value):
    """TensorFlow's parser of SLURM's list syntax, its errors one line."""
    try:
        return parse(value)
    except ValueError:
        raise UserError(
            f"{name} {value!r} is not in SLURM's syntax (e.g. "
            + ('"node[1-4],gpu7").' if name.endswith("NODELIST") else '"2(x3),1").')
        ) from None
