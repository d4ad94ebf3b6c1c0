# A/B: the build before loads-first (old) and with it (new), alternating, for each reactor count.
OUTD=${OUTD:-/tmp/boxdry/ab}; mkdir -p $OUTD
for r in ${REACTORS:-16 2 1}; do
  for b in old new new old; do
    n=$(ls $OUTD | grep -c "^r$r-$b") 
    PYTHONPATH=/tmp/kvtier-py-$b python3 bench/io/load_under_writeback.py --dir /var/tmp/kvtier-wb --chunk-mib 32 --reads 16 --writes 256 --repeat 1 --reactors $r --json $OUTD/r$r-$b-$n.json 2>&1 | tail -2 | sed "s/^/r$r $b: /"
  done
done
