"""tfstrategy inside other systems' training loops; each module imports its system only when used."""
