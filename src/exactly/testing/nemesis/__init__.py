"""The nemesis of the test kit: faults beyond process kills (network through a proxy, pauses,
full disks, clock jumps), scheduled and logged, and a checker that names anomalies."""
