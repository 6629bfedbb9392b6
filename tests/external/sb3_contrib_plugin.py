"""A pytest plugin that runs sb3-contrib's own tests with ``sb3_contrib.TRPO`` replaced by ``sb3_npg.TRPO``.

Loaded with ``-p tests.external.sb3_contrib_plugin`` before sb3-contrib's test modules import ``TRPO``
(``make test-sb3-contrib`` runs them): our TRPO must pass the tests written for the one it replaces.
"""

import sb3_contrib
import sb3_contrib.trpo

from sb3_npg import TRPO

sb3_contrib.TRPO = TRPO
sb3_contrib.trpo.TRPO = TRPO
