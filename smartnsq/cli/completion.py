"""``smartnsq completion bash|zsh``: print a shell completion script.

The script is generated from the command line's own parsers (the one ``smartnsq.cli.main``
parsed with, and the dev cluster's), so it completes exactly the commands, options and
choices this version has: commands, each command's options, option values with fixed choices
(``--sharding``, ``--access``, ``--mode``...), ``dev-cluster fault`` and its actions, and
file names for ``pub``. zsh gets the same function through ``bashcompinit``.

Install (docs/cli.md)::

    smartnsq completion bash > ~/.local/share/bash-completion/completions/smartnsq
    smartnsq completion zsh > "${fpath[1]}/_smartnsq"     # or: eval "$(smartnsq completion zsh)"
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["register", "run_completion", "script"]


def register(command: Callable[..., argparse.ArgumentParser]) -> None:
    p = command("completion", "print a bash or zsh completion script",
                description="Print a completion script for bash or zsh. bash: "
                            "smartnsq completion bash > "
                            "~/.local/share/bash-completion/completions/smartnsq; zsh: "
                            "eval \"$(smartnsq completion zsh)\" in ~/.zshrc.")
    p.add_argument("shell", choices=("bash", "zsh"), help="the shell to complete for")
    p.set_defaults(handler=run_completion)


@dataclass
class _Words:
    """What one parser level completes."""

    options: list[str] = field(default_factory=list)
    takes_value: list[str] = field(default_factory=list)
    choices: dict[str, list[str]] = field(default_factory=dict)
    positional_choices: list[str] = field(default_factory=list)
    subcommands: dict[str, _Words] = field(default_factory=dict)
    files: bool = False


def _words(parser: argparse.ArgumentParser) -> _Words:
    words = _Words()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                words.subcommands[name] = _words(sub)
            continue
        if action.option_strings:
            words.options += [o for o in action.option_strings if o.startswith("--")] \
                or list(action.option_strings)
            if action.nargs != 0:
                words.takes_value += action.option_strings
                if action.choices:
                    for option in action.option_strings:
                        words.choices[option] = [str(c) for c in action.choices]
        elif action.choices:
            words.positional_choices += [str(c) for c in action.choices]
    return words


def _tree(parser: argparse.ArgumentParser) -> _Words:
    from .devcluster import build_fault_parser
    from .devcluster import build_parser as devcluster_parser

    top = _words(parser)
    cluster = _words(devcluster_parser("smartnsq dev-cluster"))
    cluster.subcommands["fault"] = _words(build_fault_parser("smartnsq dev-cluster"))
    top.subcommands["dev-cluster"] = cluster
    if "pub" in top.subcommands:
        top.subcommands["pub"].files = True
    return top


def _q(items: list[str]) -> str:
    return shlex.quote(" ".join(items))


def _level(words: _Words, path: str, indent: str) -> list[str]:
    """The ``case`` arm body completing at one level (``path``: the command words so far)."""
    lines = [f"{indent}case \"$prev\" in"]
    for option, values in sorted(words.choices.items()):
        lines.append(f"{indent}    {option}) COMPREPLY=($(compgen -W {_q(values)} -- \"$cur\"));"
                     f" return;;")
    if words.takes_value:
        pattern = "|".join(sorted(set(words.takes_value) - set(words.choices)))
        if pattern:
            lines.append(f"{indent}    {pattern}) return;;")
    lines.append(f"{indent}esac")
    candidates = words.options + sorted(words.subcommands) + words.positional_choices
    lines.append(f"{indent}COMPREPLY=($(compgen -W {_q(candidates)} -- \"$cur\"))")
    if words.files:
        lines.append(f"{indent}[[ \"$cur\" != -* ]] && COMPREPLY+=($(compgen -f -- \"$cur\"))")
    return lines


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script for ``shell`` (``bash`` or ``zsh``) from ``parser``, the whole
    command line's (handed over by ``smartnsq.cli.main`` as ``args.parser``: this module is
    one of its commands and does not import it back)."""
    tree = _tree(parser)
    levels: dict[str, _Words] = {"": tree}
    for name, words in tree.subcommands.items():
        levels[name] = words
        for sub, sub_words in words.subcommands.items():
            levels[f"{name} {sub}"] = sub_words
            for action, action_words in sub_words.subcommands.items():
                levels[f"{name} {sub} {action}"] = action_words
    takes_value = sorted({o for w in levels.values() for o in w.takes_value})
    out = [
        f"# {shell} completion for smartnsq (generated by: smartnsq completion {shell})",
    ]
    if shell == "zsh":
        out += ["autoload -U +X bashcompinit && bashcompinit"]
    out += [
        "_smartnsq() {",
        "    local cur prev path word skip i",
        "    cur=\"${COMP_WORDS[COMP_CWORD]}\"",
        "    prev=\"${COMP_WORDS[COMP_CWORD-1]}\"",
        "    path=\"\"",
        "    skip=0",
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        "        word=\"${COMP_WORDS[i]}\"",
        "        if ((skip)); then skip=0; continue; fi",
        "        case \"$word\" in",
        f"            {'|'.join(takes_value)}) skip=1;;",
        "            -*) ;;",
        "            *) case \"${path:+$path }$word\" in",
    ]
    known = [key for key in levels if key]
    out.append(f"                   {'|'.join(shlex.quote(k) for k in known)})"
               " path=\"${path:+$path }$word\";;")
    out += [
        "               esac;;",
        "        esac",
        "    done",
        "    case \"$path\" in",
    ]
    for key, words in levels.items():
        out.append(f"        {shlex.quote(key) if key else chr(39) * 2})")
        out += _level(words, key, " " * 12)
        out.append("            ;;")
    out += [
        "    esac",
        "}",
        "complete -F _smartnsq smartnsq",
        "",
    ]
    return "\n".join(out)


def run_completion(args: argparse.Namespace) -> int:
    args.out.write(script(args.shell, args.parser))
    return 0
