package fleet

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A writer's 32-bit transaction id is placed nearest the statement's 64-bit reference (the
// snapshot's xmax, which a transaction in flight may be past), across an epoch's wrap either
// way; an id that would come before the first normal one is refused.
func TestFullXidPlacesAnIdNearestItsReference(t *testing.T) {
	t.Parallel()
	const epoch = uint64(3) << 32
	for _, c := range []struct {
		ref  uint64
		xid  uint32
		want uint64
		ok   bool
	}{
		{ref: epoch + 1000, xid: 999, want: epoch + 999, ok: true},
		{ref: epoch + 1000, xid: 1000, want: epoch + 1000, ok: true},
		{ref: epoch + 1000, xid: 1005, want: epoch + 1005, ok: true},                           // assigned past xmax
		{ref: epoch + 1000, xid: 4_000_000_000, want: epoch - 1<<32 + 4_000_000_000, ok: true}, // before the wrap
		{ref: epoch - 10, xid: 5, want: epoch + 5, ok: true},                                   // after the wrap
		{ref: 735, xid: 735, want: 735, ok: true},
		{ref: 10, xid: 4_294_967_290, ok: false}, // before the first id
	} {
		got, ok := fullXid(c.ref, c.xid)
		require.Equal(t, c.ok, ok, "%+v", c)
		if ok {
			require.Equal(t, c.want, got, "%+v", c)
		}
	}
}
