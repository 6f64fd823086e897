//go:build sluice_mutants

package outbox

// mutant is the planted bug (mutants.go) the relay plants now; built only with the
// sluice_mutants tag, where TestMutants sets it for each bug in turn.
var mutant string
