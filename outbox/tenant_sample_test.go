package outbox

import (
	"sort"
	"testing"
)

// A bucket keeps at most its share of latencies, drawn uniformly: the
// median of the sample of 0..99,999 is near 50,000.
func TestLatencySampleIsBoundedAndUniform(t *testing.T) {
	s := latencySample{rng: 1, max: 1000}
	for i := range 100_000 {
		s.add(float64(i))
	}
	if len(s.kept) != 1000 || s.seen != 100_000 {
		t.Fatalf("kept %d of %d", len(s.kept), s.seen)
	}
	sort.Float64s(s.kept)
	if m := s.kept[500]; m < 45_000 || m > 55_000 {
		t.Fatalf("median of the sample %v", m)
	}
	if s.kept[999] < 90_000 {
		t.Fatalf("the sample misses the late values: max %v", s.kept[999])
	}
}
