"""The packing engine, public: first-fit-decreasing and its neighbours on plain length arrays.

The code lives in ``packcli.plan.packing`` since 0.3.0; this name is the documented way to import it
(``from packcli.packing import first_fit_decreasing``), kept so that code written for 0.2 runs.
"""

from packcli.plan.packing import *  # noqa: F403
from packcli.plan.packing import __all__ as __all__
