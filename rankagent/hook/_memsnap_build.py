"""A build backend (PEP 517) for the memsnap hook that needs nothing but the
standard library, so `pip install ./rankagent/hook` works offline and in a fresh
virtual environment that has no setuptools or wheel. It builds a pure-Python wheel
holding memsnap_hook.py, and an sdist of this folder's sources."""
import base64
import hashlib
import io
import os
import tarfile
import zipfile

NAME, VERSION = "memsnap-hook", "0.2.0"
DIST = NAME.replace("-", "_")
HERE = os.path.dirname(os.path.abspath(__file__))
MODULES = ["memsnap_hook.py"]
METADATA = """Metadata-Version: 2.1
Name: {name}
Version: {version}
Summary: The trainer hook of memsnap: records a rank's CUDA allocations over the batch windows its memsnap agent asks for
Requires-Python: >=3.8
Classifier: Programming Language :: Python :: 3
Classifier: Operating System :: POSIX :: Linux
""".format(name=NAME, version=VERSION)
WHEEL = """Wheel-Version: 1.0
Generator: memsnap-build
Root-Is-Purelib: true
Tag: py3-none-any
"""


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = []
    for m in MODULES:
        with open(os.path.join(HERE, m), "rb") as f:
            files.append((m, f.read()))
    return _write_wheel(wheel_directory, files)


def get_requires_for_build_editable(config_settings=None):
    return []


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """`pip install -e ./rankagent/hook` (PEP 660): a wheel whose .pth file puts
    this folder on sys.path, so `import memsnap_hook` is the source file itself."""
    pth = ("__editable__.%s.pth" % DIST, (HERE + "\n").encode())
    return _write_wheel(wheel_directory, [pth])


def _write_wheel(wheel_directory, files):
    filename = "%s-%s-py3-none-any.whl" % (DIST, VERSION)
    info = "%s-%s.dist-info" % (DIST, VERSION)
    files = list(files) + [(info + "/METADATA", METADATA.encode()), (info + "/WHEEL", WHEEL.encode()),
                           (info + "/top_level.txt", b"memsnap_hook\n")]
    record = [_record_line(n, d) for n, d in files] + [info + "/RECORD,,"]
    files.append((info + "/RECORD", ("\n".join(record) + "\n").encode()))
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            z.writestr(zipfile.ZipInfo(n, date_time=(2026, 1, 1, 0, 0, 0)), d)
    return filename


def build_sdist(sdist_directory, config_settings=None):
    base = "%s-%s" % (DIST, VERSION)
    filename = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz") as t:
        for n in MODULES + ["pyproject.toml", os.path.basename(__file__)]:
            t.add(os.path.join(HERE, n), arcname=base + "/" + n)
        data = METADATA.encode()
        ti = tarfile.TarInfo(base + "/PKG-INFO")
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
    return filename
