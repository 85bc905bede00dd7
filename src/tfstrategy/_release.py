"""tfstrategy's own release (``tfstrategy.__version__``), on the ground floor so a report below the
package's face can name it without importing the face; ``pyproject.toml`` says the same number."""

__version__ = "0.2.0"
