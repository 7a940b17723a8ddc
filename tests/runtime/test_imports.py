"""The packages' import graph: no cycle between parts, a core that imports nothing of the rest,
and no torch in the core, the clock or the scheduler (they run where torch is not installed).

Every `import` and `from … import` in the project's packages counts, at any depth in a module
(a function-level import is still a dependency); an executor named in the registry as a
`module:Class` string is not an import, which is how the registry avoids one.
"""
import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("wave_actors", "gpu", "sim", "transports")
# A part is the unit a cycle is judged at: these sub-packages stand on their own.
PARTS = ("wave_actors.core", "wave_actors.runtime", "wave_actors.clock", "wave_actors.sessions",
         "wave_actors.engine", "wave_actors.node", "wave_actors.fleet", "wave_actors.bench",
         "gpu.model", "gpu.engine", "gpu.kernels", "gpu.wpk", "transports.sip", "transports.realtime")
# The serving side's floors, lowest first: a part imports only parts on floors below its own.
LAYERS = (("wave_actors.core",),
          ("wave_actors.runtime", "transports"),
          ("wave_actors.clock", "transports.sip", "transports.realtime"),
          ("wave_actors.sessions",),
          ("wave_actors.engine",),
          ("wave_actors.node",),
          ("wave_actors.fleet",),
          ("wave_actors.bench",),
          ("sim",))


def part_of(module: str) -> str | None:
    for part in sorted(PARTS, key=len, reverse=True):
        if module == part or module.startswith(part + "."):
            return part
    top = module.split(".")[0]
    return top if top in PACKAGES else None


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


@functools.cache
def nodes_of(path: Path) -> tuple[ast.AST, ...]:
    """Every node of the file's syntax tree, parsed once for all the checks of this module."""
    return tuple(ast.walk(ast.parse(path.read_text(), str(path))))


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in nodes_of(path):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def edges() -> dict[str, set[str]]:
    """part → the parts it imports (project parts only)."""
    graph: dict[str, set[str]] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            src = part_of(module_name(path))
            for imported in imports_of(path):
                dst = part_of(imported)
                if dst and dst != src:
                    graph.setdefault(src, set()).add(dst)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (cycle := visit(m)):
                return cycle
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (cycle := visit(n)):
            return cycle
    return None


def test_no_import_cycle_between_parts():
    assert find_cycle(edges()) is None, " → ".join(find_cycle(edges()))


def test_the_cycle_finder_finds_a_planted_cycle():
    """Bug it catches: a finder that never reports (the test above would pass on anything)."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def module_edges() -> dict[str, set[str]]:
    """module → the project modules it imports, `TYPE_CHECKING` imports included (`from a
    import b` names the module a.b where there is one, else a)."""
    modules = {module_name(path) for pkg in PACKAGES for path in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            src = module_name(path)
            for node in nodes_of(path):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                             else node.module for a in node.names]
                else:
                    continue
                graph.setdefault(src, set()).update(n for n in names if n in modules and n != src)
    return graph


def test_no_import_cycle_between_modules():
    """Bug it catches: a part that reaches back into the module that holds it (`frames_in`
    typed against the clock's module, the front's halves against `node.py`): a part then
    cannot be read or tested without its owner. Parts take a protocol of what they read."""
    graph = module_edges()
    assert "wave_actors.clock.clock" in graph
    assert find_cycle(graph) is None, " → ".join(find_cycle(graph))


def floor_breaches(graph: dict[str, set[str]]) -> list[str]:
    """Edges that do not run down the floors of LAYERS (parts off the floors: none checked)."""
    floor = {part: i for i, parts in enumerate(LAYERS) for part in parts}
    return [f"{a} → {b}" for a in sorted(graph) for b in sorted(graph[a])
            if a in floor and b in floor and floor[b] >= floor[a]]


def test_each_part_imports_only_the_floors_below_it():
    """Bug it catches: a lower part reaching up (the clock importing the session actor's
    message type made `clock` and `sessions` a loop)."""
    assert not floor_breaches(edges())


def test_the_floor_check_finds_a_planted_upward_import():
    assert floor_breaches({"wave_actors.clock": {"wave_actors.sessions"}}) == \
        ["wave_actors.clock → wave_actors.sessions"]
    assert floor_breaches({"wave_actors.sessions": {"wave_actors.clock"}}) == []


def test_the_gpu_side_uses_only_the_core_of_the_serving_side():
    """The executors and the model implement the core's contract; nothing of the actors, the
    clock or the node reaches into the device code's imports."""
    graph = edges()
    for part in ("gpu.model", "gpu.engine", "gpu.kernels", "gpu.wpk"):
        serving = {p for p in graph.get(part, ()) if p.startswith("wave_actors")}
        assert serving <= {"wave_actors.core"}, (part, serving)


def test_the_core_imports_nothing_of_the_other_parts():
    core = ROOT / "wave_actors" / "core"
    for path in core.rglob("*.py"):
        outside = {m for m in imports_of(path)
                   if part_of(m) and part_of(m) != "wave_actors.core"}
        assert not outside, f"{path.relative_to(ROOT)} imports {sorted(outside)}"


TORCH_FREE = ("wave_actors.core.contract", "wave_actors.core.sched.slot_book",
              "wave_actors.core.sched.session_table", "wave_actors.core.text",
              "wave_actors.core.sched.start_policy", "wave_actors.clock.clock",
              "wave_actors.core.sched.jitter", "wave_actors.node.node", "sim.executor",
              "wave_actors.core.registry")
# Imported one after another in one fresh interpreter: the first module after whose import the
# target is loaded brought it in (what the modules before it loaded did not, or it would be there).
_FIRST_BRINGING = """
import importlib, sys
for name in sys.argv[2:]:
    importlib.import_module(name)
    if sys.argv[1] in sys.modules:
        print(name)
        break
"""


def first_bringing(target: str, modules) -> str:
    """The first of `modules` whose import (transitive ones too) loads `target` ('' : none)."""
    out = subprocess.run([sys.executable, "-c", _FIRST_BRINGING, target, *modules], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_no_torch_in_the_core_the_clock_or_the_scheduler():
    culprit = first_bringing("torch", TORCH_FREE)
    assert culprit == "", f"{culprit} imports torch"


def test_the_import_check_names_the_module_that_brings_its_target():
    """Bug it catches: a check that never reports (the one above would pass on anything), or
    one that blames a module imported before the one that loaded the target (`fractions`
    imports `decimal`)."""
    assert first_bringing("decimal", ["array", "fractions", "json"]) == "fractions"
    assert first_bringing("decimal", ["array", "json"]) == ""


def test_the_node_hosts_sessions_through_one_protocol():
    """Bug it catches: the front branching on where a session runs (a close path for actors
    in its process and another for sessions in workers, an `isinstance` on the session): the
    node reaches sessions only through `sessions.hosts`, never their implementations."""
    node = imports_of(ROOT / "wave_actors" / "node" / "node.py")
    reached = {m for m in node if m.startswith("wave_actors.sessions")}
    assert reached <= {"wave_actors.sessions.hosts", "wave_actors.sessions.hosts.HostedSession",
                       "wave_actors.sessions.hosts.HostEvents",
                       "wave_actors.sessions.hosts.make_host",
                       "wave_actors.sessions.messages", "wave_actors.sessions.messages.AudioIn",
                       "wave_actors.sessions.messages.Close",
                       "wave_actors.sessions.messages.FunctionResult",
                       "wave_actors.sessions.messages.SessionConfig"}, sorted(reached)


def project_bases() -> dict[str, list[str]]:
    """Every class of the serving side (wave_actors, gpu, sim) → the names of its bases."""
    found = {}
    for pkg in ("wave_actors", "gpu", "sim"):
        for path in (ROOT / pkg).rglob("*.py"):
            for node in nodes_of(path):
                if isinstance(node, ast.ClassDef):
                    found[f"{module_name(path)}.{node.name}"] = [ast.unparse(b) for b in node.bases]
    return found


def test_policies_and_the_clock_are_composed_not_inherited():
    """Bug it catches: a policy made by overriding another's methods (`HeadroomAdmission`
    was an `EagerStarts` with its hooks replaced), or a second clock class that fills in
    the first one's empty hooks (`EngineClock`): behaviour then lives in two places."""
    bases = project_bases()
    policies = {k: v for k, v in bases.items() if k.startswith("wave_actors.core.sched.start_policy.")}
    assert policies and all(b in ([], ["Protocol"]) for b in policies.values()), policies
    clocks = [k for k, v in bases.items() if "BeatClockActor" in v]
    assert clocks == [], clocks
