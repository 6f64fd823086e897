package cli

import "github.com/spf13/cobra"

// CommandTree builds the command tree Run executes, for tests that walk every command.
func CommandTree() *cobra.Command {
	a := &app{}
	a.io.withDefaults()
	return a.rootCommand()
}

// What a command says it changes (its changesAnnotation).
const (
	ChangesAnnotation = changesAnnotation
	ChangesGuarded    = changesGuarded
	ChangesNothing    = changesNothing
	ChangesUnguarded  = changesUnguarded
)
