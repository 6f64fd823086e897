package inbox

import (
	"io"

	"github.com/sluicehq/sluice/pkg/metrics"
)

// recorder combines the EMF shorthand w and rec; nil when both are unset (no metrics, no work).
func recorder(w io.Writer, rec metrics.Recorder) metrics.Recorder {
	if w == nil {
		return metrics.Tee(rec)
	}
	return metrics.Tee(metrics.NewEMF(w), rec)
}

// dimensions are the dimensions of one inbox consumer's metrics.
func dimensions(service, consumer string) metrics.Dimensions {
	return metrics.Dimensions{metrics.DimensionService: service, metrics.DimensionConsumer: consumer}
}
