from petra_hub.recipe.train import main

if __name__ == "__main__":
    main()
