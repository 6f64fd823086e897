package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Transactions are ranked by age, replication holds by transaction id age; a slot is named
// only when it holds the horizon further back than every transaction, and a logical slot's
// catalog_xmin (the system catalogs only) does not count in XIDAge.
func TestHorizonFromRanksTransactionsAndSlots(t *testing.T) {
	t.Parallel()
	d := func(v time.Duration) *time.Duration { return &v }
	n := func(v int64) *int64 { return &v }
	require.Equal(t, Horizon{}, horizonFrom(nil))

	tx := []horizonHolder{
		{timed: true, name: "session 1", age: d(time.Minute), xidAge: n(50)},
		{timed: true, name: "prepared transaction p", age: d(time.Hour), xidAge: n(40)},
		{timed: true, name: "session 2", age: d(-time.Millisecond), xidAge: nil},
	}
	h := horizonFrom(tx)
	require.Equal(t, Horizon{OldestTransactionAge: time.Hour, HeldBy: "prepared transaction p", XIDAge: 50}, h)

	younger := append(tx, horizonHolder{name: "replication slot s", xidAge: n(45)})
	require.Empty(t, horizonFrom(younger).Replication, "a slot younger than a transaction does not hold the horizon")

	older := append(tx, horizonHolder{name: "replication slot s", xidAge: n(45)}, horizonHolder{name: "replication slot old", xidAge: n(900)})
	h = horizonFrom(older)
	require.Equal(t, "replication slot old", h.Replication)
	require.Equal(t, int64(900), h.XIDAge)
	require.Equal(t, "prepared transaction p", h.HeldBy)

	catalog := horizonFrom([]horizonHolder{{name: "replication slot logical", catalogOnly: true, xidAge: n(7)}})
	require.Equal(t, Horizon{Replication: "replication slot logical"}, catalog)
}
