"""Built-in generators. Each module registers its schedules on import; the list below is the only
place that names them, so adding an algorithm is one new module and one line here."""

from . import (  # noqa: F401
    auto,
    classic,
    dualpipe,
    interleaved,
    roundrobin,
    vshape,
    zb_auto,
    zb_handcrafted,
)
