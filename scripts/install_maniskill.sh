#!/usr/bin/env bash
# The [maniskill] extra: mani-skill 3.0.1 (SAPIEN 3) with torch pinned to the CPU build, then a CPU Vulkan driver
# for SAPIEN. Debian 12's lavapipe (Mesa 22.3) is too old for SAPIEN; lavapipe from bookworm-backports' Mesa 25 is
# downloaded with a private apt state (the system's apt sources are not touched), unpacked with `dpkg -x` into
# <venv>/share/lavapipe/ and named by an ICD file there (rlinf_like/envs/vulkan.py points VK_ICD_FILENAMES at it).
# The Vulkan step never fails the install: without it the ManiSkill tests skip, naming this script.
#     bash scripts/install_maniskill.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m pip install --quiet --disable-pip-version-check -c constraints-cpu.txt "mani-skill==3.0.1"
DEST=$(realpath "$("$PY" -c "import sys; print(sys.prefix)")")/share/lavapipe  # realpath: .venv may be a link

lavapipe() {
  [[ -f "$DEST/lvp_icd.json" ]] && { echo "lavapipe: already in $DEST"; return 0; }
  command -v nvidia-smi >/dev/null && { echo "lavapipe: NVIDIA GPU present, not needed"; return 0; }
  command -v apt-get >/dev/null && command -v dpkg >/dev/null || { echo "lavapipe: needs apt-get and dpkg"; return 1; }
  grep -q 'VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null ||
    { echo "lavapipe: not Debian 12; install your distribution's mesa-vulkan-drivers (Mesa >= 24.3)"; return 1; }
  local tmp; tmp=$(mktemp -d)
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
  echo "deb http://deb.debian.org/debian bookworm-backports main" >"$tmp/sources.list"
  local apt=(-q -o Dir::Etc::sourcelist="$tmp/sources.list" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$tmp/lists"
             -o Dir::Cache="$tmp/cache" -o APT::Sandbox::User=root)
  apt-get "${apt[@]}" update >/dev/null && (cd "$tmp" && apt-get "${apt[@]}" download mesa-vulkan-drivers/bookworm-backports >/dev/null) || return 1
  mkdir -p "$DEST" && dpkg -x "$tmp"/mesa-vulkan-drivers_*.deb "$DEST/root" || return 1
  local lib="$DEST/root/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so"
  [[ -f "$lib" ]] || { echo "lavapipe: $lib missing from the package"; return 1; }
  printf '{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "1.3.0"}}\n' "$lib" >"$DEST/lvp_icd.json"
  echo "lavapipe: Mesa $(dpkg-deb -f "$tmp"/mesa-vulkan-drivers_*.deb Version) in $DEST"
  rm -rf "$tmp" "$DEST/root/usr/share/doc"
  find "$DEST/root" -name "libvulkan_*.so" ! -name libvulkan_lvp.so -delete  # the GPU drivers: not needed
}
lavapipe || echo "install_maniskill: no CPU Vulkan driver installed; ManiSkill tests will skip" >&2
"$PY" -c "import mani_skill, sapien; print(f'mani-skill {mani_skill.__version__}, sapien {sapien.__version__}')"
