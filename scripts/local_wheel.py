"""Whether a wheel of NAME==VERSION lies on this machine's disk, for this Python.

Looks in pip's configured find-links folders and file:// indexes (pip config), so that the
install script can prefer a release that installs without downloading anything.

    python scripts/local_wheel.py torch 2.14.1          # exit 0 if on disk, 1 if not
    python scripts/local_wheel.py --print torchvision 0.28.0+cpu   # prints the version found
"""
import glob
import os
import subprocess
import sys
import urllib.parse


def local_folders():
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    folders = []
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if not key.endswith(("find-links", "index-url")):
            continue
        for item in value.strip().strip("'\"").split():
            if item.startswith("file://"):
                item = urllib.parse.urlparse(item).path
            if os.path.isdir(item):
                folders.append(item)
    return folders


def main(argv):
    show = argv[:1] == ["--print"]
    if show:
        argv = argv[1:]
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    name, version = argv
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    pattern = f"{name}-{version}-{tag}-*.whl"
    for folder in local_folders():
        # An index folder holds project pages whose links point at ../../files/; look there too.
        for where in (folder, os.path.join(folder, "..", "files")):
            if glob.glob(os.path.join(where, pattern)):
                if show:
                    print(version)
                return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
