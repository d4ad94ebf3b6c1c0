# Sourced by the scripts that build kvtier on the GPU box (scripts/gpu_bench.sh, scripts/h200/bench_io.sh): when
# liburing or libxxhash is missing there, unpacks the Debian packages carried in .gpudeps/ into a private sysroot
# and points pkg-config, CMake and the loader at it. Fetch them on a networked machine with
#   mkdir -p .gpudeps && cd .gpudeps && apt-get download liburing2 liburing-dev libxxhash0 libxxhash-dev \
#       pkgconf pkgconf-bin libpkgconf3
# (keep .gpudeps out of git with .git/info/exclude, and name it in the device tool's carry).
# Returns non-zero, having said why, when the libraries are missing and no packages were carried.
kvtier_use_debs() {
  local sysroot=/tmp/kvtier-sysroot need=0 pc f libdir
  for pc in liburing libxxhash; do pkg-config --exists "$pc" 2>/dev/null || need=1; done
  if [ "$need" = 1 ]; then
    if ! ls .gpudeps/*.deb >/dev/null 2>&1; then echo "missing liburing/xxhash and no .gpudeps/*.deb"; return 1; fi
    rm -rf "$sysroot" && mkdir -p "$sysroot"
    for f in .gpudeps/*.deb; do dpkg -x "$f" "$sysroot"; done
    libdir=$sysroot/usr/lib/x86_64-linux-gnu
    sed -i "s|=/usr|=$sysroot/usr|" "$libdir"/pkgconfig/*.pc
    export PKG_CONFIG_PATH=$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export CMAKE_PREFIX_PATH=$sysroot/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
    command -v pkg-config >/dev/null || export PATH=$sysroot/usr/bin:$PATH
    echo "using liburing/xxhash from .gpudeps ($sysroot)"
  fi
  pkg-config --modversion liburing libxxhash
}
