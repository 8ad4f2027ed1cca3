"""Nothing petra_hub exchanges between ranks is pickled: torch's object collectives unpickle what the other ranks
send, and gloo's TCP is unauthenticated. Ranks exchange JSON and tensors (`petra_hub.engine.wire`) instead."""

import re
from pathlib import Path

import petra_hub

OBJECT_COLLECTIVES = re.compile(r"\b(all_gather_object|broadcast_object_list|gather_object|scatter_object_list|"
                                r"send_object_list|recv_object_list)\s*\(")


def test_no_module_calls_an_object_collective():
    root = Path(petra_hub.__file__).parent
    calls = [f"{path.relative_to(root)}:{number}" for path in sorted(root.rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1) if OBJECT_COLLECTIVES.search(line)]
    assert calls == []
