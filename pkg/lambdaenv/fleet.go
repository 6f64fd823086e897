package lambdaenv

// The fleet's variables: a relay (or consumer) function serves a fleet of tenant databases
// (pkg/fleet) instead of one when FleetTenants or FleetRegistrySecretARN/FleetRegistryURL is
// set.
const (
	// FleetTenants is a JSON array of fleet.Tenant ({"name","secretArn","server","weight"} or
	// {"name","databaseUrl"}): the static registry the stack's settings give.
	FleetTenants = "SLUICE_FLEET_TENANTS"
	// FleetRegistrySecretARN names the RDS secret of the control database whose
	// sluice_fleet_tenant table lists tenants added without a deploy (fleet.Table).
	FleetRegistrySecretARN = "SLUICE_FLEET_REGISTRY_SECRET_ARN"
	// FleetRegistryURL is the control database's URL; used locally and in tests. Takes
	// precedence over FleetRegistrySecretARN.
	FleetRegistryURL = "SLUICE_FLEET_REGISTRY_URL"
	// FleetServerConnections is a JSON object mapping a server name (fleet.Tenant.Server) to
	// the most connections this function may hold on it; servers it does not name get
	// FleetDefaultServerConnections.
	FleetServerConnections = "SLUICE_FLEET_SERVER_CONNECTIONS"
	// FleetDefaultServerConnections is the connection budget of a server FleetServerConnections
	// does not name. Defaults to fleet.DefaultServerConnections.
	FleetDefaultServerConnections = "SLUICE_FLEET_DEFAULT_SERVER_CONNECTIONS"
	// FleetShard is "I/N": this function serves the tenants whose fleet.ShardOf(name, N) is I,
	// so N functions (each with its own schedule) split a large fleet. Defaults to "0/1".
	FleetShard = "SLUICE_FLEET_SHARD"
)
