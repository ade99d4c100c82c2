# What tools/gpu-check.sh and tools/gpu-profile.sh share on a GPU machine (sourced, not run).

# .gpu-carry/binaries.tar.gz (tools/gpu-carry.sh build) unpacked into bin/ and lib/ of the folder
# $1, replacing any left there by an earlier run.
unpack_carried_binaries() {
  [ -f "$1/binaries.tar.gz" ] || return 0
  rm -rf "$1/bin" "$1/lib"
  tar -xzf "$1/binaries.tar.gz" -C "$1"
}

python_sites() {
  python3 -c 'import site, sysconfig; print("\n".join(dict.fromkeys(site.getsitepackages() + [sysconfig.get_paths()["purelib"]])))' 2>/dev/null
}
# The first existing file named $1 under the pip packages' nvidia/ folders, then in $2...
find_file() {
  local name="$1" d f
  shift
  while read -r d; do
    [ -d "$d/nvidia" ] || continue
    f="$(find "$d/nvidia" -maxdepth 4 -name "$name" -print -quit 2>/dev/null)"
    [ -z "$f" ] || { echo "$f"; return; }
  done < <(python_sites)
  for d in "$@"; do [ -e "$d/$name" ] && { echo "$d/$name"; return; }; done
}
