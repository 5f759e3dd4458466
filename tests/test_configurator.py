"""
Tests for configurator.py: config files and --key=value flags over a script's globals.

    python -m pytest -q tests/test_configurator.py
"""
import ast
import json
import os
import subprocess
import sys

import pytest

from configurator import configure, print_config, save_config


def script_globals():
    """What a train.py module namespace looks like when it calls configure()."""
    return dict(
        __name__='__main__', _private_helper=3, os=os, helper=lambda x: x,  # never config keys
        learning_rate=2e-5, batch_size=32, compile=False, out_dir='out', init_from=None,
        betas=(0.9, 0.999), eval_datasets=['A', 'B'], extra={'a': 1},
    )


def write(tmp_path, text, name='override.py'):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_keys_are_public_plain_values_and_globals_update_in_place():
    namespace = script_globals()
    config = configure(namespace, ['--batch_size=8'])
    assert list(config) == ['learning_rate', 'batch_size', 'compile', 'out_dir', 'init_from',
                            'betas', 'eval_datasets', 'extra']
    assert namespace['batch_size'] == 8 and config['batch_size'] == 8


def test_unknown_key_in_file_names_file_and_key(tmp_path):
    path = write(tmp_path, 'learning_rat = 1e-5\n')
    with pytest.raises(ValueError, match=r"override\.py.*'learning_rat'.*learning_rate"):
        configure(script_globals(), [path])


def test_file_may_import_and_use_private_names(tmp_path):
    path = write(tmp_path, 'import math\n_base = 4\nbatch_size = int(math.sqrt(_base)) * 16\n')
    assert configure(script_globals(), [path])['batch_size'] == 32


def test_unknown_key_on_command_line_suggests_close_match():
    with pytest.raises(ValueError, match=r"'learning_rat'.*did you mean learning_rate"):
        configure(script_globals(), ['--learning_rat=1e-5'])


def test_flag_without_value_is_an_error():
    with pytest.raises(ValueError, match='--key=value'):
        configure(script_globals(), ['--compile'])


def test_wrong_type_names_key_and_types():
    with pytest.raises(TypeError, match=r"batch_size expects int.*got str"):
        configure(script_globals(), ["--batch_size='8'"])
    with pytest.raises(ValueError, match='not a Python literal'):
        configure(script_globals(), ['--batch_size=eight'])


def test_wrong_type_in_file_names_the_file(tmp_path):
    path = write(tmp_path, 'compile = "yes"\n')
    with pytest.raises(TypeError, match=r"override\.py.*compile expects bool.*got str"):
        configure(script_globals(), [path])


def test_int_accepted_for_float_and_converted():
    config = configure(script_globals(), ['--learning_rate=1'])
    assert config['learning_rate'] == 1.0 and type(config['learning_rate']) is float


def test_bool_rejected_for_int_and_float_and_int_for_bool():
    for flag in ['--batch_size=True', '--learning_rate=False', '--compile=1']:
        with pytest.raises(TypeError):
            configure(script_globals(), [flag])


def test_only_first_equals_splits():
    assert configure(script_globals(), ['--out_dir=a=b'])['out_dir'] == 'a=b'


def test_string_without_quotes_and_numeric_looking_string():
    config = configure(script_globals(), ['--out_dir=out/run1'])
    assert config['out_dir'] == 'out/run1'
    assert configure(script_globals(), ['--out_dir=2024'])['out_dir'] == '2024'
    assert configure(script_globals(), ["--out_dir='quoted'"])['out_dir'] == 'quoted'


def test_none_default_accepts_literal_or_raw_text():
    assert configure(script_globals(), ['--init_from=3'])['init_from'] == 3
    assert configure(script_globals(), ['--init_from=out/stage1/step2000'])['init_from'] == 'out/stage1/step2000'


def test_list_and_tuple_values_keep_the_default_type():
    config = configure(script_globals(), ["--eval_datasets=['C', 'D', 'E']", '--betas=[0.8,0.9]'])
    assert config['eval_datasets'] == ['C', 'D', 'E']
    assert config['betas'] == (0.8, 0.9)
    with pytest.raises(TypeError):
        configure(script_globals(), ['--eval_datasets=7'])


def test_arguments_apply_left_to_right(tmp_path):
    path = write(tmp_path, 'batch_size = 16\nlearning_rate = 2e-6\n')
    config = configure(script_globals(), [path, '--batch_size=4'])
    assert config['batch_size'] == 4 and config['learning_rate'] == 2e-6
    config = configure(script_globals(), ['--batch_size=4', path])
    assert config['batch_size'] == 16


def test_config_round_trips_through_json(tmp_path, capsys):
    config = configure(script_globals(), ['--betas=(0.5, 0.6)', '--out_dir=out/run1'])
    path = str(tmp_path / 'config.json')
    save_config(config, path)
    loaded = json.load(open(path))
    assert loaded == {**config, 'betas': [0.5, 0.6]}  # JSON has no tuples
    assert configure(script_globals(), [f'--{key}={value!r}' for key, value in loaded.items()]) == config
    print_config(config)
    assert "out_dir       = 'out/run1'" in capsys.readouterr().out


# -----------------------------------------------------------------------------
# the repository's own configs and scripts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def script_defaults(script):
    """A script's config globals, as it defines them above its configure() call, without running the script:
    its module-level assignments from the first to the call, executed alone."""
    tree = ast.parse(open(os.path.join(ROOT, script)).read())
    body, started = [], False
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id == 'config' or node.targets[0].id == 'DEFAULTS':
                break
            started = True
            body.append(node)
        elif started:
            break
    namespace = {'torch': __import__('torch')}
    exec(compile(ast.Module(body, []), script, 'exec'), namespace)
    return {k: v for k, v in namespace.items() if k != 'torch' and not k.startswith('__')}


TOY_PATHS = ['--init_from=data/shapes/tiny-qwen3.5', "--train_data=['data/shapes/train.jsonl']",
             '--image_dir=data/shapes/images']
TRAIN_CONFIGS = sorted(name for name in os.listdir(os.path.join(ROOT, 'config')) if name != 'shapes_eval.py')


@pytest.mark.parametrize('name', TRAIN_CONFIGS)
def test_every_training_config_resolves_and_its_stage_two_starts_from_a_kept_checkpoint(name):
    defaults = script_defaults('train.py')
    config = configure(dict(defaults), [os.path.join(ROOT, 'config', name)])
    assert config['similarity'] in ('cos', 'dot') and config['weighting'] in ('focal', 'random', 'query_positive',
                                                                             'query_negative')
    assert config['temperature'] == {'cos': 0.1, 'dot': 100.0}[config['similarity']] / (5 if config['grad_cache_chunk'] else 1) \
        or name.startswith('shapes_')  # Table 3, and Table 6's tau / 5 with GradCache
    assert config['learning_rate'] == (2e-5 if config['lora_rank'] else 2e-6) or name.startswith('shapes_')
    assert config['batch_size'] % 8 == 0  # splits over 8 GPUs
    configure(dict(defaults), [os.path.join(ROOT, 'config', name)] + TOY_PATHS)  # and with the toy's paths
    stage_one = os.path.basename(config['init_from'])
    if stage_one.startswith('step_'):  # a Stage II: the Stage I config that writes its init_from keeps that step
        out_dir, step = os.path.dirname(config['init_from']), int(stage_one[len('step_'):])
        writers = [other for other in TRAIN_CONFIGS
                   if configure(dict(defaults), [os.path.join(ROOT, 'config', other)])['out_dir'] == out_dir]
        assert len(writers) == 1, (name, out_dir)
        writer = configure(dict(defaults), [os.path.join(ROOT, 'config', writers[0])])
        assert step in writer['keep_checkpoints'] and step <= writer['max_iters'], (name, writers[0])


def test_the_eval_config_resolves():
    config = configure(dict(script_defaults('eval.py')), [os.path.join(ROOT, 'config', 'shapes_eval.py')])
    assert config['init_from'] == 'out/shapes_stage2/export' and config['instructions'] == 'paper'


@pytest.mark.parametrize('script,args,message', [
    ('train.py', ['--learning_rat=1'], "error: --learning_rat=1: unknown config key 'learning_rat'; did you mean "
                                       "learning_rate?"),
    ('train.py', ['--init_from=/no/such/folder'], "error: '/no/such/folder' is neither a Hugging Face folder"),
    ('eval.py', ['--init_from=/no/such/folder', '--mmeb_dir=x'], "error: '/no/such/folder' is neither"),
])
def test_a_mistake_ends_in_one_line_without_a_traceback(script, args, message, tmp_path):
    run = subprocess.run([sys.executable, os.path.join(ROOT, script), f'--out_dir={tmp_path}' if script == 'train.py'
                          else f'--out={tmp_path}/e.json', *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and 'Traceback' not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith(message), run.stderr[-2000:]


def test_an_error_inside_a_library_keeps_its_traceback(tmp_path):
    from configurator import purposeful_message
    try:
        json.loads('{')  # raised inside the standard library, not by this repository's code
    except ValueError as error:
        assert purposeful_message(error, error.__traceback__) is None
    try:
        configure(script_globals(), ['--nope=1'])
    except ValueError as error:
        assert "unknown config key 'nope'" in purposeful_message(error, error.__traceback__)


def test_the_wandb_run_id_survives_a_resume_and_not_a_fresh_start(tmp_path):
    from configurator import wandb_run_id
    first = wandb_run_id(str(tmp_path), resuming=False)
    assert (tmp_path / 'wandb_run_id').read_text().strip() == first
    assert wandb_run_id(str(tmp_path), resuming=True) == first  # --resume=True continues the same W&B run
    fresh = wandb_run_id(str(tmp_path), resuming=False)
    assert fresh != first and wandb_run_id(str(tmp_path), resuming=True) == fresh
    (tmp_path / 'new').mkdir()  # resuming a run that never logged to W&B: a new id, kept from now on
    assert wandb_run_id(str(tmp_path / 'new'), resuming=True) == (tmp_path / 'new' / 'wandb_run_id').read_text().strip()


def test_progress_says_done_rate_and_time_left(capsys, monkeypatch):
    from configurator import Progress, duration
    clock = iter([0.0, 0.0, 40.0, 80.0])
    monkeypatch.setattr('configurator.time.time', lambda: next(clock))
    progress = Progress(100, 'encoding', every=10.0)
    progress.update(25)  # 40 s in: 25 items, 0.6/s, 75 left -> 2:00
    progress.update(75)  # done
    lines = capsys.readouterr().out.splitlines()
    assert lines == ['encoding: 25/100 items, 0.6/s, 0:40 elapsed, ~2:00 left', 'encoding: 100/100 items, 1.2/s, 1:20 elapsed']
    assert duration(3725) == '1:02:05' and duration(65) == '1:05'
