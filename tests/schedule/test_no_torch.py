import subprocess
import sys


def test_schedule_core_imports_no_torch():
    code = (
        "import sys; import sglang_vpp.schedule as s; "
        "s.build_schedule('vpp-pack', 2, 8, [1000], 128); "
        "assert 'torch' not in sys.modules, 'torch was imported'; "
        "assert 'numpy' not in sys.modules, 'numpy was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
