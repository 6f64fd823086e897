package infra

import (
	"fmt"
	"strings"
)

// ConnectionBudget is a database server's connection budget: its max_connections less a
// reserve, and what the stack's functions book of it. Synthesis fails, showing the arithmetic,
// once the bookings reach the budget. Migrations is the budget of its database's server
// (MigrationsProps.MaxConnections); an OutboxFleet books its relays on each of its servers'
// budgets (FleetServer).
type ConnectionBudget interface {
	// UseConnections books connections of the server for what (e.g. "relay: 6 × 4"); the
	// constructs book their functions themselves. It panics, showing the arithmetic, once the
	// bookings reach max_connections − the reserve; a budget without max_connections only
	// records them.
	UseConnections(what string, connections int)
}

// connectionBudget is the one implementation of ConnectionBudget.
type connectionBudget struct {
	// server names the server in the error; "" for the migrations' own database.
	server   string
	max      int
	reserved int
	// remedy ends the error: what to change.
	remedy   string
	bookings []booking
}

type booking struct {
	what string
	n    int
}

// UseConnections implements ConnectionBudget.
func (b *connectionBudget) UseConnections(what string, n int) {
	b.bookings = append(b.bookings, booking{what, n})
	if b.max == 0 {
		return
	}
	total := 0
	terms := make([]string, len(b.bookings))
	for i, bk := range b.bookings {
		total += bk.n
		terms[i] = fmt.Sprintf("%s = %d", bk.what, bk.n)
	}
	server := "the server"
	if b.server != "" {
		server = "the server " + b.server
	}
	if budget := b.max - b.reserved; total >= budget {
		panic(fmt.Errorf("sluice: the functions may open more database connections than %s allows:\n  %s\n  total %d, but max_connections %d − %d reserved = %d must stay above it.\n%s",
			server, strings.Join(terms, "\n  + "), total, b.max, b.reserved, budget, b.remedy))
	}
}
