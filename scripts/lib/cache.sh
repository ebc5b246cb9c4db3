# shellcheck shell=bash
# Validators for the caches Joule's scripts keep (sourced by scripts/build-images.sh and
# scripts/gpu-check.sh; tested by tests/deploy/cache_test.sh). Each returns 0 only for an
# entry that can be used as it is, and prints nothing: the caller says what it rebuilds.
# A cache entry is always written beside its final name and renamed once valid, so a run
# killed halfway leaves a *.partial that the next run removes, never a half entry.

# cache_valid_rootfs_tar FILE: FILE is a regular, complete tar archive of a Debian root file
# system (it holds etc/debian_version and usr/bin/). A directory, an empty or truncated
# file, or any other archive is invalid (issue 23: mmdebstrap, given base.tar.partial,
# wrote a directory that was then taken for the tarball forever).
cache_valid_rootfs_tar() {
  local file=$1 listing
  [[ -f $file && ! -L $file && -s $file ]] || return 1
  listing=$(tar -tf "$file" 2>/dev/null) || return 1
  grep -qE '^(\./)?etc/debian_version$' <<<"$listing" || return 1
  grep -qE '^(\./)?usr/bin/' <<<"$listing" || return 1
}

# cache_valid_deb FILE [PACKAGE]: FILE is a complete Debian package (dpkg-deb can read its
# control data and list its contents), of PACKAGE when given.
cache_valid_deb() {
  local file=$1 want=${2:-} name
  [[ -f $file && ! -L $file && -s $file ]] || return 1
  name=$(dpkg-deb --field "$file" Package 2>/dev/null) || return 1
  [[ -z $want || $name == "$want" ]] || return 1
  dpkg-deb --contents "$file" >/dev/null 2>&1 || return 1
}

# cache_valid_gzip FILE: FILE is a complete gzip stream (gzip -t checks the CRC and length).
cache_valid_gzip() {
  local file=$1
  [[ -f $file && ! -L $file && -s $file ]] || return 1
  gzip -t "$file" 2>/dev/null
}

# cache_valid_fashion_mnist DIR: DIR holds the four Fashion-MNIST IDX files, gzip, each
# complete and of the size the dataset has (60,000 / 10,000 examples of 28x28 images).
cache_valid_fashion_mnist() {
  local dir=$1 f expect n
  for f in train-images-idx3-ubyte:47040016 train-labels-idx1-ubyte:60008 \
           t10k-images-idx3-ubyte:7840016 t10k-labels-idx1-ubyte:10008; do
    expect=${f#*:}; f=${f%%:*}
    cache_valid_gzip "$dir/$f.gz" || return 1
    n=$(gzip -dc "$dir/$f.gz" | wc -c) || return 1
    [[ $n == "$expect" ]] || return 1
  done
}
