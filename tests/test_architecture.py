"""The layers of the package, as the README draws them, checked against the imports: a module imports only from
its own layer and the layers below it."""

import ast
import pathlib
import re
import textwrap

import verl

PACKAGE = pathlib.Path(verl.__file__).parent
README = PACKAGE.parent / "README.md"

# Bottom to top: (name, what it holds, module prefixes). A module belongs to the layer of its longest prefix.
LAYERS = [
    ("foundations", "DataProto, the typed config sections, utilities, the sandbox",
     ["verl", "verl.protocol", "verl.base_config", "verl.workers.config", "verl.trainer.config.algorithm",
      "verl.trainer.config.config", "verl.utils", "verl.sandbox"]),
    ("algorithms", "advantage estimators, policy and value losses, KL: pure tensor functions", ["verl.algorithms"]),
    ("models", "loading Hugging Face models, packed forwards, log-probs in chunks", ["verl.models"]),
    ("data and scoring", "datasets, rule rewards, the reward model's forward, tools, simulated users",
     ["verl.data", "verl.rewards", "verl.tools", "verl.interactions"]),
    ("engines", "the FSDP2 training engine; the rollout engines and the agent loop; weight sync to a separate rollout",
     ["verl.workers.engine", "verl.workers.rollout", "verl.checkpoint_engine"]),
    ("single controller", "Worker, @register dispatch, Ray and local worker groups", ["verl.single_controller"]),
    ("workers", "one class per role, the actor's and critic's math on one rank", ["verl.workers"]),
    ("driver", "the run spec, the PPO loop, reward managers, CLIs, the Python API",
     ["verl.trainer", "verl.rewards.managers", "verl.rewards.loading", "verl.rewards.generative", "verl.model_merger",
      "verl.experimental"]),
]


def layer_of(module: str) -> int:
    best = max(((i, prefix) for i, (_, _, prefixes) in enumerate(LAYERS) for prefix in prefixes
                if module == prefix or module.startswith(prefix + ".")), key=lambda hit: len(hit[1]))
    return best[0]


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        yield name, path


def imports(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("verl"):
            yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names if alias.name.startswith("verl"))


def render() -> str:
    width = max(len(name) for name, _, _ in LAYERS)
    rows = []
    for i, (name, what, prefixes) in reversed(list(enumerate(LAYERS))):
        rows.append(f"{i}  {name:<{width}}  {what}")
        modules = textwrap.wrap(", ".join(p for p in prefixes if p != "verl"), 100 - width)
        rows += [f"   {'':<{width}}  {line}" for line in modules]
    return "\n".join(rows)


def test_every_module_imports_only_its_layer_and_below():
    upward = [f"{name}:{line} ({LAYERS[layer_of(name)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
              for name, path in modules() for line, target in imports(path) if layer_of(target) > layer_of(name)]
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def test_the_readme_draws_these_layers():
    block = re.search(r"<!-- layers -->\n```text\n(.*?)\n```", README.read_text(), re.S)
    assert block, "README.md lacks the layer picture (between <!-- layers --> and the code fence)"
    assert block.group(1) == render(), f"README.md's layer picture is out of date; it should read:\n{render()}"
