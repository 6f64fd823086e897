package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A key the stream woke is woken again (walRewakes) only while no round of the relay has read
// the row the stream reported: a round that read it, or a later row of the key, drops the key
// from every stage; one that read only earlier rows (the reported row not yet visible to it)
// leaves the key to be woken again.
func TestWALReWakesOnlyKeysWhoseReportedRowNoRoundRead(t *testing.T) {
	t.Parallel()
	r := &Relay{book: newKeyBook(100)}
	f := &walFollower{r: r}
	// The stages' keys as the stream's wakes left them (their timers are not armed: the test
	// fires the stages itself, after the rounds' reads).
	f.recheck[0] = map[string]walRecheck{"read": {id: 5}, "later": {id: 6}, "earlier": {id: 9}, "untouched": {id: 3}}
	f.recheck[1] = map[string]walRecheck{"read-before": {id: 4}}
	f.sawRows([]*claimedRow{
		{Event: Event{ID: 5, PartitionKey: "read"}},
		{Event: Event{ID: 7, PartitionKey: "later"}},
		{Event: Event{ID: 8, PartitionKey: "earlier"}},
		{Event: Event{ID: 4, PartitionKey: "read-before"}},
	})
	f.wakeAgain(0)
	f.wakeAgain(1)
	require.ElementsMatch(t, []string{"earlier", "untouched"}, r.book.take(10, time.Now()).keys,
		"only the keys whose reported row no round read are woken again")
}
