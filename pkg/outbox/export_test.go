package outbox

// What the external tests (package outbox_test) check of unexported wire details.
var (
	Attributes     = attributes
	GroupID        = groupID
	PayloadPointer = payloadPointer
)

// Limits the external tests assert against.
const (
	SNSMaxAttributes   = snsMaxAttributes
	MaxWriteAttributes = maxWriteAttributes
	MaxLinksPerSpan    = maxLinksPerSpan
	OffloadSampleRows  = offloadSampleRows
)

// LockKeysSQL locks partition keys as a relay round does (tests of who holds a key).
var LockKeysSQL = lockKeysSQL
