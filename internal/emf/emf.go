// Package emf forwards the metric names and dimensions that moved to pkg/metrics (which also
// holds the Embedded Metric Format writer, metrics.EMF), so that code built on these names
// (the CDK alarms in infra/) keeps compiling. New code imports pkg/metrics.
package emf

import "github.com/sluicehq/sluice/pkg/metrics"

// Namespace is the CloudWatch namespace of every sluice metric.
const Namespace = metrics.Namespace

// Unit is a CloudWatch metric unit.
type Unit = metrics.Unit

// The units sluice uses.
const (
	Count        = metrics.Count
	Seconds      = metrics.Seconds
	Milliseconds = metrics.Milliseconds
)
