"""drums: isolated, resettable, forkable Linux desktops for computer-use agents.

    with drums.connect() as client:             # DRUMS_URL, DRUMS_TOKEN / DRUMS_TOKEN_FILE
        with client.create(task="e0df059f-...") as env:
            env.wait_valid()
            obs = env.observe()
            env.step("pyautogui.click(100, 200)")
            result = env.verify()                # strict: raises InvalidEpisode, never a bad reward

`AsyncClient` / `aconnect()` have the same surface for asyncio and trio.
"""

from ._async_client import AsyncClient as AsyncClient
from ._async_client import AsyncEnv as AsyncEnv
from ._async_client import aconnect as aconnect
from ._base import Forked as Forked
from ._client import Client as Client
from ._client import Env as Env
from ._client import connect as connect
from ._config import Secret as Secret
from ._exceptions import ActionFailed as ActionFailed
from ._exceptions import BadResponse as BadResponse
from ._exceptions import CheckerFailed as CheckerFailed
from ._exceptions import CleanupFailed as CleanupFailed
from ._exceptions import Conflict as Conflict
from ._exceptions import ConnectionFailed as ConnectionFailed
from ._exceptions import DaemonUnavailable as DaemonUnavailable
from ._exceptions import DrumsError as DrumsError
from ._exceptions import EnvGone as EnvGone
from ._exceptions import InvalidEpisode as InvalidEpisode
from ._exceptions import InvalidRequest as InvalidRequest
from ._exceptions import NotFound as NotFound
from ._exceptions import NotQuiescent as NotQuiescent
from ._exceptions import Overloaded as Overloaded
from ._exceptions import Quarantined as Quarantined
from ._exceptions import RestoreFailed as RestoreFailed
from ._exceptions import SetupFailed as SetupFailed
from ._exceptions import ShuttingDown as ShuttingDown
from ._exceptions import StateDirFull as StateDirFull
from ._exceptions import Timeout as Timeout
from ._exceptions import Unauthorized as Unauthorized
from ._exceptions import UnsupportedTask as UnsupportedTask
from ._observation import Observation as Observation
from ._retry import RetryPolicy as RetryPolicy
from ._routes import Timeouts as Timeouts
from ._version import __version__ as __version__
from .models import Action as Action
from .models import Checkpoint as Checkpoint
from .models import GateReport as GateReport
from .models import StepResult as StepResult
from .models import VerifyResult as VerifyResult

# What env.save() returns: a checkpoint of kind "saved".
SavedState = Checkpoint
