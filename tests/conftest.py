import os
import sys

# tests import their helpers (gradcheck) by module name; the package comes from src/ when not installed
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
