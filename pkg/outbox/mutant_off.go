//go:build !sluice_mutants

package outbox

// mutant is the planted bug (mutants.go): none without the sluice_mutants tag.
const mutant = ""
