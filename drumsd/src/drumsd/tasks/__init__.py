"""The task bridge: OSWorld-format tasks, their setup steps, checkers and the reward audit.

What the daemon calls:
  resolve_task(ref, task_dirs) / task_support_table(ctx) / support(task, ctx)
  await ensure_checker_venv(root) at start, then context_for_checker(ctx, venv, uid, gid)
  await run_setup(task, access, ctx, run_dir=..., label=...)          before the episode
  await verify(task, access, ctx, EpisodeFacts(...)) -> AuditedScore   on POST .../verify
"""

from .audit import Audit as Audit
from .audit import AuditedScore as AuditedScore
from .audit import EpisodeFacts as EpisodeFacts
from .audit import ScopeReport as ScopeReport
from .audit import scan_scope as scan_scope
from .audit import verify as verify
from .checker_venv import CheckerVenv as CheckerVenv
from .checker_venv import context_for_checker as context_for_checker
from .checker_venv import ensure_checker_venv as ensure_checker_venv
from .checker_venv import load_checker_venv as load_checker_venv
from .evaluate import Evaluation as Evaluation
from .evaluate import evaluate as evaluate
from .host_support import TaskSupport as TaskSupport
from .host_support import support as support
from .host_support import task_support_table as task_support_table
from .model import CheckerEnv as CheckerEnv
from .model import MetricCatalog as MetricCatalog
from .model import ScopeManifest as ScopeManifest
from .model import Task as Task
from .model import TaskContext as TaskContext
from .model import TaskError as TaskError
from .model import resolve_task as resolve_task
from .setup import SetupError as SetupError
from .setup import SetupReport as SetupReport
from .setup import SlotAccess as SlotAccess
from .setup import WindowInfo as WindowInfo
from .setup import run_postconfig as run_postconfig
from .setup import run_setup as run_setup
