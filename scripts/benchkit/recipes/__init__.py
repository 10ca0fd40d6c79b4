"""bench_recipes.py: recipes trained for equal time, evaluated at marks, reported."""
