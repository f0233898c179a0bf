"""An embedded NSQ cluster (youzan or classic) for tests, demos and local development."""
