"""
configurator.py: every script's config: its globals, overridden by config files and --key=value flags, checked.
One idiom for every script (train.py, eval.py, the tools, bench, the toy): the defaults are plain globals with one
comment each, and configure() overrides them in place:

    learning_rate = 2e-5  # AdamW peak learning rate (Table 3)
    ...
    config = configure(globals(), sys.argv[1:])  # updates the globals in place, returns the dict

train.py calls it at the top, as nanoGPT does; a script whose functions are imported elsewhere (eval.py, tools/)
calls it first thing in main(argv), which then reads the globals and passes them on to its functions explicitly.
Every call starts from the values the script was written with, so main() may run twice in one process. Run as

    python train.py config/stage1.py --learning_rate=1e-5 --out_dir=out/run1
    python train.py --help          # every key, its default and its comment, read from the script itself

Arguments apply left to right, so later ones win. Config keys: every lower-case name that does not start with
'_' and whose value is None or an int, float, bool, str, list, tuple or dict, at the moment configure() is first
called. UPPER_CASE names are constants, never keys; modules, functions and classes neither. A bare argument
ending in .py is a config file; a script that takes paths (tools/plot.py's run folders) names the list key they
go to (positional=...). Unlike nanoGPT's configurator, a file or flag that names an unknown key fails
(suggesting the closest, or the keys it abbreviates: --lr), `--learning_rate=1` is accepted for a float default, and
one bare value of a list key is a one-item list (`--train_data=data/x.jsonl`), of a key whose default is the empty
tuple a one-item tuple (`--matryoshka_dims=16`). The forms people type work too: a bare boolean flag (`--resume`),
true / false in any case, and `--key value` with a space. Every mistake is a common.UserError, which the scripts
print as one line.
"""
import ast
import copy
import difflib
import inspect
import os
import re
import sys
import types

from common import UserError

CONFIG_TYPES = (type(None), bool, int, float, str, list, tuple, dict)
EXAMPLES = {bool: "True or False", int: "32", float: "2e-05", list: "['a', 'b']", tuple: "(16, 32)",
            dict: "{'key': 1}"}


def config_keys(namespace):
    """The config part of a namespace, in definition order: public lower-case names holding plain values."""
    return {key: value for key, value in namespace.items()
            if not key.startswith('_') and not key.isupper() and isinstance(value, CONFIG_TYPES)}


def unknown_key_message(key, keys, source):
    """The error of an unknown key, naming the closest keys."""
    short = [k for k in keys if "".join(word[:1] for word in k.split("_")) == key or k.startswith(key)]  # --lr
    close = list(dict.fromkeys(short + difflib.get_close_matches(key, keys, n=3)))[:3]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return f"{source}: unknown config key {key!r}{hint}"


def type_hint(key, default):
    """'key expects int, e.g. --key=32 (default 16)': what a key takes, for an error message."""
    kind = type(default)
    example = repr(default).replace(" ", "") if kind is tuple and default else EXAMPLES.get(kind)  # (0.9,0.999)
    return f"{key} expects {kind.__name__}" + (f", e.g. --{key}={example}" if example else "") + f" (default {default!r})"


def value_of_type(key, value, default, source):
    """value, converted to the default's type where that is lossless; UserError on a mismatch."""
    if default is None:  # no type to check against
        return value
    if isinstance(default, bool) or isinstance(value, bool):  # bool is an int subclass: never mix them
        ok = isinstance(default, bool) and isinstance(value, bool)
    elif isinstance(default, float) and isinstance(value, int):  # `--learning_rate=1` means 1.0
        return float(value)
    elif isinstance(default, (list, tuple)) and isinstance(value, (list, tuple)):
        return type(default)(value)  # `(1, 2)` and `[1, 2]` both mean a sequence
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise UserError(f"{source}: {type_hint(key, default)}, got {type(value).__name__} {value!r}")
    return value


def parse_flag(arg, config):
    """'--key=value' -> (key, value). A str key keeps the raw text unless it parses to a str literal; a list key
    given one value that is not a list takes it as a one-item list."""
    if '=' not in arg:
        raise UserError(f"{arg}: expected --key=value")
    key, text = arg[2:].split('=', 1)  # only the first '=' splits: --out_dir=a=b gives 'a=b'
    if key not in config:
        raise UserError(unknown_key_message(key, config, arg))
    default = config[key]
    if isinstance(default, bool) and text.strip().lower() in ("true", "false"):
        return key, text.strip().lower() == "true"  # --resume=true, --resume=FALSE
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        if isinstance(default, (str, type(None), list)):
            return key, [text] if isinstance(default, list) else text  # --out_dir=out/run1, --datasets=Shapes-CLS
        raise UserError(f"{arg}: {text!r} is not a value of its type: {type_hint(key, default)}") from None
    if isinstance(default, str) and not isinstance(value, str):
        return key, text  # --run_name=2024 is the string '2024'
    if isinstance(default, list) and not isinstance(value, (list, tuple)):
        return key, [value]  # --train_data='data/x.jsonl' or a dict entry
    if default == () and not isinstance(value, (list, tuple)):
        return key, (value,)  # --matryoshka_dims=16: a tuple of any length, here one item
    return key, value


def file_values(path):
    """The names a config file assigns. It runs in a fresh namespace: it may import and compute."""
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such config file (a flag is written --key=value)")
    with open(path) as f:
        namespace = {'__file__': path}
        exec(compile(f.read(), path, 'exec'), namespace)
    return {key: value for key, value in namespace.items()
            if not key.startswith('_') and not callable(value) and not isinstance(value, types.ModuleType)}


def read_config_file(path, config):
    """file_values of a config file, every name checked to be a key of config."""
    overrides = file_values(path)
    for key in overrides:
        if key not in config:
            raise UserError(unknown_key_message(key, config, path))
    return overrides


def configure(namespace, args, positional=None):
    """Apply config files and --key=value flags (in order) to namespace, starting from the values the script was
    written with; return the config dict. positional: the list key that takes bare arguments which are not config
    files (a script's paths). --help (or -h) prints every key with its default and comment and exits 0."""
    defaults = namespace.setdefault('_config_defaults', copy.deepcopy(config_keys(namespace)))
    config, chosen = copy.deepcopy(defaults), set()
    if '--help' in args or '-h' in args:
        print_help(namespace.get('__file__', ''), namespace.get('__doc__') or '', config, namespace)
        sys.exit(0)
    args = list(args)
    while args:
        arg = args.pop(0)
        if arg.startswith('--') and '=' not in arg:  # --resume (a boolean, set), --max_iters 10 (the value after)
            key = arg[2:]
            if key not in config:
                raise UserError(unknown_key_message(key, config, arg))
            if isinstance(config[key], bool) and not (args and args[0].lower() in ("true", "false")):
                arg += "=True"
            elif not args or args[0].startswith('--'):
                raise UserError(f"{arg}: expected a value: --{key}=VALUE or --{key} VALUE")
            else:
                arg += "=" + args.pop(0)
        if arg.startswith('--'):
            key, value = parse_flag(arg, config)
            config[key] = value_of_type(key, value, config[key], arg)
            chosen.add(key)
        elif arg.endswith('.py') or positional is None:
            for key, value in read_config_file(arg, config).items():
                config[key] = value_of_type(key, value, config[key], arg)
                chosen.add(key)
        else:
            config[positional] = list(config[positional]) + [arg]
    namespace.update(config)
    namespace['_config_chosen'] = chosen  # chosen(namespace): the keys a file or flag set, whatever their value
    return config


def chosen(namespace):
    """The keys the last configure() of namespace had set by a config file or flag (a default set again counts)."""
    return set(namespace.get('_config_chosen', ()))


def key_comments(*sources):
    """{key: its one-line comment} read from source files: the comment on the line that assigns it, a script's
    `key = value  # comment` or a dataclass field's `key: type = value  # comment` (the first source's wins)."""
    comments = {}
    for source in sources:
        if source and os.path.isfile(source):
            with open(source, encoding="utf-8") as f:
                for line in f:
                    match = re.match(r"(?:(\w+)|\s+(\w+): [^=]+) = .*?  # (.*)$", line.rstrip())
                    if match:
                        comments.setdefault(match.group(1) or match.group(2), match.group(3))
    return comments


def print_help(script, doc, config, namespace=None):
    """`python SCRIPT --help`: the start of the script's docstring (what it is, how to run it), then every
    `key = default  # comment`; keys a script takes from a dataclass (train.py's from model.EmbeddingSpec) have the
    comments of its fields."""
    folder, name = os.path.split(os.path.abspath(script)) if script else ("", "this script")
    if os.path.isfile(os.path.join(folder, "__init__.py")):  # a folder's script runs as python -m folder.script
        command = f"python -m {os.path.basename(folder)}.{os.path.splitext(name)[0]}"
    else:
        command = f"python {name}"
    head = doc.strip().split("\n\n")[:2]
    print("\n\n".join(head) + "\n" if head and head[0] else "", end="")
    print(f"\nusage: {command} [config/FILE.py ...] [--key=value ...]   (later arguments win)\n")
    dataclasses = [value for value in (namespace or {}).values() if hasattr(value, "__dataclass_fields__")]
    print_config(config, key_comments(script, *(inspect.getsourcefile(value) for value in dataclasses)))


def print_config(config, comments=None):
    """Every `key = value`, aligned, each with its comment from `comments` ({key: comment}) where it has one."""
    width = max(map(len, config), default=0)
    for key, value in config.items():
        comment = (comments or {}).get(key, "")
        print(f"{key:<{width}} = {value!r}" + (f"  # {comment}" if comment else ""))


def check_choice(key, value, allowed):
    """value when it is one of `allowed`, else a UserError naming the key and the choices."""
    if value not in allowed:
        raise UserError(f"{key} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def check_counts(config, keys):
    """A UserError naming the first of `keys` (counts: steps, sizes, items) whose value is below 1."""
    for key in keys:
        if config[key] < 1:
            raise UserError(f"{key} must be at least 1, got {config[key]}")
